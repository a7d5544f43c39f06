"""MkDocs hook: lets mkdocstrings read `kfast` laid out as it installs (mkdocs.yml names this file).

`callbacks/` and `recipes/` sit at the top of the repository but install as `kfast.callbacks` and
`kfast.recipes` (setup.cfg's `package_dir`). griffe reads source statically and finds packages by folder,
so from the checkout alone `kfast.callbacks.GPUMonitor` does not exist for it. Before each build this
hook writes `build/api-src/kfast/`: a folder of symbolic links to every entry of `kfast/`, plus one link
per mapped package, which is the tree a wheel holds. mkdocs.yml points the python handler there.
"""

import configparser
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.join(ROOT, "build", "api-src")


def _package_dirs():
    """{installed package: folder in the checkout} from setup.cfg's `package_dir`."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    pairs = (line.split("=", 1) for line in cfg["options"]["package_dir"].splitlines() if "=" in line)
    return {name.strip(): folder.strip() for name, folder in pairs}


def build_tree():
    """Writes the installed layout of `kfast` under build/api-src and returns that folder."""
    shutil.rmtree(TREE, ignore_errors=True)
    top = os.path.join(TREE, "kfast")
    os.makedirs(top)
    mapped = {name: folder for name, folder in _package_dirs().items() if name != "kfast"}
    for entry in os.listdir(os.path.join(ROOT, "kfast")):
        if entry != "__pycache__":
            os.symlink(os.path.join(ROOT, "kfast", entry), os.path.join(top, entry))
    for name, folder in mapped.items():
        # Only one level below kfast is mapped today (kfast.callbacks, kfast.recipes).
        os.symlink(os.path.join(ROOT, folder), os.path.join(TREE, *name.split(".")))
    return TREE


def on_startup(command, dirty):
    build_tree()
