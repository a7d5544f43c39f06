"""A regular (non-editable) install works: build the sdist and wheel, install the wheel into a fresh
virtualenv, and use kfast from outside the checkout, worker processes included.

The editable install that `make test` uses maps `kfast.*` onto the checkout, so it hides any file that a
wheel leaves out; here nothing of the checkout is importable. The fresh virtualenv borrows the test
environment's dependencies through a `.pth` line (a plain path entry: the editable install's own `.pth`
finder in that folder is not run), so nothing is downloaded.
"""

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile

import pytest

from helpers import REPO

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]  # builds an sdist and two wheels, makes a venv

_CHECK = """
import importlib, importlib.util, os, pkgutil, sys
import kfast
root = os.path.dirname(kfast.__file__)
assert root.startswith(sys.prefix), (root, sys.prefix)
names = sorted(m.name for m in pkgutil.walk_packages(kfast.__path__, "kfast."))
for name in names:
    # A __main__ module runs the command line when imported: found, not run.
    module = importlib.util.find_spec(name) if name.endswith(".__main__") else importlib.import_module(name)
    path = module.origin if name.endswith(".__main__") else module.__file__
    assert path.startswith(sys.prefix), (name, path)
for top in ("callbacks", "recipes"):
    try:
        importlib.import_module(top)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"`import {top}` worked; only kfast.{top} may be installed")
print("modules", " ".join(names))
"""

_DATASET = """
import os
import numpy as np
import kfast


class Squares:
    # Each worker notes where its kfast came from, to prove workers import the installed package.
    def __init__(self, out):
        self.out = out

    def __len__(self):
        return 6

    def __getitem__(self, i):
        with open(os.path.join(self.out, f"worker-{os.getpid()}"), "w") as f:
            f.write(kfast.__file__)
        x = np.full((4, 3), i, dtype="float32")
        return x, x.sum(axis=1) ** 2
"""

_EPOCH = """
import sys
import numpy as np
import kfast
from squares import Squares

if __name__ == "__main__":
    with kfast.data.FastLoader(Squares(sys.argv[1]), workers=2, use_multiprocessing=True) as loader:
        seen = sorted(int(x[0, 0]) for x, y in loader)
    assert seen == list(range(6)), seen
    print("epoch ok")
"""


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _source_tree(dest):
    # What git would ship: tracked files and new files that are not ignored, as in a fresh clone.
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).split("\0")
    for rel in filter(None, files):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            with open(src, "rb") as fin, open(os.path.join(dest, rel), "wb") as fout:
                fout.write(fin.read())


def _fresh_venv(path):
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = os.path.join(path, "bin", "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    with open(os.path.join(site, "_test_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Builds the sdist and both wheels, installs the checkout's wheel into a fresh venv."""
    tmp = tmp_path_factory.mktemp("install")
    src, dist, from_sdist = tmp / "src", tmp / "dist", tmp / "from-sdist"
    _source_tree(src)
    # python -m build makes the sdist, then the wheel from that sdist: a file the sdist lacks is missing there.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)])
    (sdist,) = dist.glob("kfast-*.tar.gz")
    (wheel,) = dist.glob("kfast-*.whl")
    _run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(from_sdist), str(src)])
    (direct,) = from_sdist.glob("kfast-*.whl")
    python = _fresh_venv(tmp / "venv")
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {"tmp": tmp, "python": python, "bin": os.path.dirname(python), "sdist": sdist, "wheel": wheel,
            "direct": direct, "env": {**env, "PYTHONNOUSERSITE": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}}


def _members(wheel):
    return sorted(n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n)


def test_wheel_holds_every_package_and_no_top_level_folders(installed):
    names = _members(installed["wheel"])
    for module in ("kfast/__init__.py", "kfast/data/__init__.py", "kfast/data/_workers/worker.py",
                   "kfast/callbacks/__init__.py", "kfast/recipes/__init__.py"):
        assert module in names
    shipped = {os.path.dirname(n) for n in names}
    on_disk = {os.path.relpath(d, REPO) for d, _, files in os.walk(os.path.join(REPO, "kfast"))
               if "__init__.py" in files}
    assert on_disk <= shipped
    assert not any(n.startswith(("callbacks/", "recipes/", "tests/", "benchmarks/")) for n in names)


def test_sdist_holds_every_file_the_wheel_needs(installed):
    # The wheel built through the sdist equals the one built straight from the source tree.
    assert _members(installed["wheel"]) == _members(installed["direct"])
    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.cfg", "setup.py", "pyproject.toml", "README.md"} <= names


def test_installed_package_imports_every_module_outside_the_checkout(installed, tmp_path):
    out = _run([installed["python"], "-c", _CHECK], cwd=tmp_path, env=installed["env"])
    names = out.split("modules", 1)[1].split()
    assert {"kfast.data.loader", "kfast.callbacks.lr_warmup", "kfast.recipes.tabular"} <= set(names)


def test_installed_command_line(installed, tmp_path):
    kfast = os.path.join(installed["bin"], "kfast")
    assert "doctor" in _run([kfast, "--help"], cwd=tmp_path, env=installed["env"])
    report = json.loads(_run([kfast, "doctor", "--json"], cwd=tmp_path, env=installed["env"]))
    assert report["kfast"] == "0.1.0"


def test_installed_loader_workers_use_the_installed_package(installed, tmp_path):
    (tmp_path / "squares.py").write_text(textwrap.dedent(_DATASET))
    (tmp_path / "epoch.py").write_text(textwrap.dedent(_EPOCH))
    marks = tmp_path / "marks"
    marks.mkdir()
    out = _run([installed["python"], "epoch.py", str(marks)], cwd=tmp_path, env=installed["env"])
    assert "epoch ok" in out
    seen = {p.read_text() for p in marks.iterdir()}
    assert seen and all(path.startswith(str(installed["tmp"] / "venv")) for path in seen), seen
