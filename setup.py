"""Package discovery for kfast; every other piece of metadata lives in setup.cfg.

`callbacks/` and `recipes/` sit at the top of the repository but install as `kfast.callbacks` and
`kfast.recipes` (setup.cfg's `package_dir`). setuptools' `find:` cannot discover packages through such a
mapping, and a hand-written list forgets new subpackages (it once left out `kfast.data`), so the list is
found here: every package under `kfast/`, plus every package under each mapped folder, renamed.
"""

from setuptools import find_packages
from setuptools import setup

_MAPPED = {"callbacks": "kfast.callbacks", "recipes": "kfast.recipes"}


def _packages():
    found = find_packages(include=["kfast", "kfast.*"])
    for folder, name in _MAPPED.items():
        found += [name + sub[len(folder):] for sub in find_packages(include=[folder, f"{folder}.*"])]
    return sorted(found)


setup(packages=_packages())
