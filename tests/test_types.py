"""The type check: mypy finds no error in kfast, kfast.callbacks and kfast.recipes, and every public
function and method carries annotations.

Run the same mypy check by hand, with any extra mypy arguments after it:

    .venv/bin/python tests/test_types.py

NOTE [ Why mypy runs on a tree of links ]
callbacks/ and recipes/ live at the top of the repository and install as kfast.callbacks and
kfast.recipes (setup.cfg's package_dir). mypy cannot see that mapping: it finds modules by walking
folders, and the editable install reaches them through an import hook that mypy does not run. So the check
lays the packages out as they are installed, in a temporary folder of symbolic links (kfast/* links to
kfast/*, kfast/callbacks links to callbacks/, ...), runs mypy there and writes each error's path back as a
path in the repository. The settings are setup.cfg's [mypy] sections; the cache sits in build/mypy-cache.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP_CFG = ROOT / "setup.cfg"
CACHE_DIR = ROOT / "build" / "mypy-cache"
# A cold run (no cache) takes under a minute on two cores; a warm one a few seconds.
MYPY_TIMEOUT_S = 540


def _package_dirs() -> dict[str, Path]:
    """Installed package name -> its source folder, from setup.cfg's package_dir."""
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    mapping = {}
    for line in config["options"]["package_dir"].strip().splitlines():
        name, _, folder = line.partition("=")
        mapping[name.strip()] = ROOT / folder.strip()
    return mapping


def _link_tree(tree: Path, packages: dict[str, Path]) -> dict[Path, Path]:
    """Lays `packages` out under `tree` as installed; returns each linked folder's tree path -> source."""
    linked: dict[Path, Path] = {}
    for name in sorted(packages, key=lambda n: n.count(".")):
        target = tree.joinpath(*name.split("."))
        source = packages[name]
        if any(other.startswith(name + ".") for other in packages):
            # A mapped package lands inside this one: a real folder whose entries link to the source.
            target.mkdir(parents=True, exist_ok=True)
            for entry in sorted(source.iterdir()):
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
            linked[target.relative_to(tree)] = source.relative_to(ROOT)
        else:
            if target.is_symlink():  # a stray link of the parent's to the same name
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source, target_is_directory=True)
            linked[target.relative_to(tree)] = source.relative_to(ROOT)
    return linked


def _repo_path(line: str, linked: dict[Path, Path]) -> str:
    """Rewrites the path that opens one line of mypy's output from the link tree to the repository."""
    path, sep, rest = line.partition(":")
    if not sep or not path.endswith((".py", ".pyi")):
        return line
    for tree_dir in sorted(linked, key=lambda p: len(p.parts), reverse=True):
        if Path(path).parts[: len(tree_dir.parts)] == tree_dir.parts:
            inside = Path(path).relative_to(tree_dir)
            return f"{(linked[tree_dir] / inside).as_posix()}{sep}{rest}"
    return line


def run_mypy(*extra: str, timeout: float = MYPY_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Runs mypy over every installed kfast package; stdout's paths are the repository's."""
    packages = _package_dirs()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kfast-mypy-") as tmp:
        tree = Path(tmp)
        linked = _link_tree(tree, packages)
        command = [sys.executable, "-m", "mypy", "--config-file", str(SETUP_CFG), "--cache-dir", str(CACHE_DIR)]
        # `-p kfast` takes its subpackages with it, kfast.callbacks and kfast.recipes included (naming them
        # too would make mypy see each of their files twice).
        for name in sorted(packages):
            if not any(name.startswith(other + ".") for other in packages):
                command += ["-p", name]
        # Run from the link tree, so that the only kfast mypy can find is the one laid out there.
        env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
        result = subprocess.run(
            [*command, *extra], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
        )
    stdout = "\n".join(_repo_path(line, linked) for line in result.stdout.splitlines())
    return subprocess.CompletedProcess(result.args, result.returncode, stdout, result.stderr)


@pytest.mark.timeout(MYPY_TIMEOUT_S + 30)
def test_mypy_reports_no_errors():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed in this environment (it comes with the `test` extra)")
    result = run_mypy()
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}\n{result.stderr}"
    # mypy read every file of the three folders, callbacks/ and recipes/ included.
    files = sum(1 for source in _package_dirs().values() for f in source.rglob("*.py") if "__pycache__" not in f.parts)
    assert f"no issues found in {files} source files" in result.stdout, result.stdout


def test_mypy_checks_callbacks_and_recipes(tmp_path):
    """The link tree holds every file of the mapped folders under its installed name."""
    packages = _package_dirs()
    linked = _link_tree(tmp_path, packages)
    assert set(linked.values()) == {source.relative_to(ROOT) for source in packages.values()}
    for name, source in packages.items():
        for file in source.rglob("*.py"):
            installed = tmp_path.joinpath(*name.split("."), file.relative_to(source))
            assert installed.is_file() and installed.resolve() == file.resolve(), (name, file)
    line = "kfast/callbacks/lr_warmup.py:3: error: boom  [misc]"
    assert _repo_path(line, linked) == "callbacks/lr_warmup.py:3: error: boom  [misc]"
    assert _repo_path("kfast/data/loader.py:9: note: x", linked) == "kfast/data/loader.py:9: note: x"


# --- every public function and method is annotated --------------------------------------------------

_SELF_NAMES = ("self", "cls")


def _public_modules() -> list[tuple[str, Path]]:
    """(dotted installed name, file) of every module whose path has no private component."""
    found = []
    for package, source in _package_dirs().items():
        for file in sorted(source.rglob("*.py")):
            parts = [*package.split("."), *file.relative_to(source).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if "__pycache__" in file.parts or any(part.startswith("_") for part in parts):
                continue
            found.append((".".join(parts), file))
    return found


def _missing(func: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    """What `func`'s signature lacks: the names of unannotated parameters, and "return"."""
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list)
    if is_method and not is_static and positional and positional[0].arg in _SELF_NAMES:
        positional = positional[1:]
    params = [*positional, *args.kwonlyargs]
    missing = [a.arg for a in params if a.annotation is None]
    missing += [f"*{a.arg}" for a in (args.vararg,) if a is not None and a.annotation is None]
    missing += [f"**{a.arg}" for a in (args.kwarg,) if a is not None and a.annotation is None]
    if func.returns is None:
        missing.append("return")
    return missing


def _public_functions(body: list[ast.stmt], prefix: str = "", is_method: bool = False):
    """Yields (qualified name, node, is_method) for the public defs in a module or class body.

    A public class's `__init__` counts too: it is the class's signature. Defs under module-level `if` and
    `try` count; defs inside function bodies do not.
    """
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not node.name.startswith("_") or (is_method and node.name == "__init__"):
                yield prefix + node.name, node, is_method
        elif isinstance(node, ast.ClassDef):
            if not node.name.startswith("_"):
                yield from _public_functions(node.body, f"{prefix}{node.name}.", is_method=True)
        elif isinstance(node, ast.If):
            yield from _public_functions(node.body + node.orelse, prefix, is_method)
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            yield from _public_functions(node.body + handlers + node.orelse + node.finalbody, prefix, is_method)


def unannotated_public_functions() -> list[str]:
    """One line per public function or method that lacks an annotation, as `path:line name: lacks ...`."""
    offenders = []
    for _, file in _public_modules():
        tree = ast.parse(file.read_text(), filename=str(file))
        for name, node, is_method in _public_functions(tree.body):
            missing = _missing(node, is_method)
            if missing:
                where = f"{file.relative_to(ROOT).as_posix()}:{node.lineno}"
                offenders.append(f"{where} {name}: lacks {', '.join(missing)}")
    return offenders


def test_public_functions_are_annotated():
    offenders = unannotated_public_functions()
    assert not offenders, (
        f"{len(offenders)} public functions or methods lack parameter or return annotations:\n"
        + "\n".join(offenders)
    )


def test_annotation_check_sees_what_it_should():
    """The AST walk flags a bare parameter and a missing return, and passes self, cls and private names."""
    source = '''
def ok(a: int, *args: str, b: int = 1, **kw: float) -> None: ...
def bare(a, b: int): ...
def _private(a): ...
class Public:
    def __init__(self, n): ...
    def method(self, x: int) -> int: ...
    @classmethod
    def make(cls) -> "Public": ...
    @staticmethod
    def helper(self): ...
    def _hidden(self, y): ...
class _Private:
    def method(self, z): ...
if True:
    def conditional(q) -> None: ...
'''
    found = {
        name: _missing(node, is_method) for name, node, is_method in _public_functions(ast.parse(source).body)
    }
    assert found == {
        "ok": [],
        "bare": ["a", "return"],
        "Public.__init__": ["n", "return"],
        "Public.method": [],
        "Public.make": [],
        "Public.helper": ["self", "return"],
        "conditional": ["q"],
    }
    modules = dict(_public_modules())
    assert "kfast.callbacks.lr_warmup" in modules and "kfast.recipes.tabular" in modules
    assert "kfast" in modules and "kfast.data" in modules
    assert not any(part.startswith("_") for name in modules for part in name.split("."))


if __name__ == "__main__":
    completed = run_mypy(*sys.argv[1:])
    print(completed.stdout)
    print(completed.stderr, end="", file=sys.stderr)
    sys.exit(completed.returncode)
