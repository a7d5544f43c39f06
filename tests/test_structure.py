"""The code's shape: no import cycle among kfast's modules (function-level imports included), one module
importing Horovod, and loader workers that import nothing heavy."""

import ast
import importlib
import os
import subprocess
import sys
import textwrap

from helpers import REPO

ROOTS = {"kfast": "kfast", "kfast.callbacks": "callbacks", "kfast.recipes": "recipes"}


def _modules():
    """{module name: path} for every module, named as installed (callbacks/ is kfast.callbacks)."""
    found = {}
    for package, folder in ROOTS.items():
        for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
            rel = os.path.relpath(dirpath, os.path.join(REPO, folder))
            prefix = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for name in files:
                if name.endswith(".py"):
                    found[prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"] = os.path.join(dirpath, name)
    return found


def _read(path):
    with open(path) as f:
        return f.read()


def _type_checking_blocks(tree):
    """Nodes under `if TYPE_CHECKING:`: what type checkers read, never run."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    return skipped


def _imports(path, modules):
    """kfast modules `path` imports anywhere: at module level, inside functions (a lazy import hides a cycle,
    it does not remove it); not under `if TYPE_CHECKING:`, except in a module with a `__getattr__`, whose
    TYPE_CHECKING imports name what it loads lazily (PEP 562), and so are its imports too."""
    tree = ast.parse(_read(path))
    lazy = any(isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for f in tree.body)
    skipped = set() if lazy else _type_checking_blocks(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import submodule` depends on the submodule (the package's own __init__, run
            # first by Python for any submodule, is not counted: a package may import its children).
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


# Import edges the cycle check leaves out, each with its reason. Keep this empty unless one must stay.
ALLOWED = set()


def test_no_import_cycle_among_kfast_modules():
    modules = _modules()
    graph = {m: _imports(p, modules) - {m} - {d for a, d in ALLOWED if a == m} for m, p in modules.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert "kfast.distributed._horovod" in graph and not graph["kfast.distributed._horovod"]


def _imports_horovod(path):
    for node in ast.walk(ast.parse(_read(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "horovod" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "horovod":
            return True
    return False


def test_only_one_module_imports_horovod():
    importers = [m for m, p in _modules().items() if _imports_horovod(p)]
    assert importers == ["kfast.distributed._horovod"]


def test_a_loader_worker_imports_numpy_and_the_dataset_only(tmp_path):
    (tmp_path / "plain_data.py").write_text(textwrap.dedent("""
        import sys
        import numpy as np

        class Modules:
            def __len__(self):
                return 2

            def __getitem__(self, i):
                heavy = [name in sys.modules for name in ("keras", "tensorflow", "jax", "torch", "kfast.callbacks")]
                return np.array(heavy, "int8")
    """))
    code = textwrap.dedent("""
        import time
        start = time.perf_counter()
        import kfast.data
        from plain_data import Modules
        with kfast.data.FastLoader(Modules(), workers=1, use_multiprocessing=True) as loader:
            batches = [b.tolist() for b in loader]
        print(batches, f"{time.perf_counter() - start:.2f}")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    batches, seconds = proc.stdout.rsplit(" ", 1)
    assert batches == "[[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]"  # nothing heavy in the worker


def test_lazy_names_are_the_ones_type_checkers_see():
    """A package that loads names on first use lists each under `if TYPE_CHECKING:` too: those imports are
    how the cycle check above sees the lazy ones, so a name missing there would hide an edge."""
    for package in ("kfast", "kfast.data"):
        module = importlib.import_module(package)
        tree = ast.parse(_read(module.__file__))
        checked = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   for alias in node.names if id(node) in _type_checking_blocks(tree)}
        assert set(module._HOMES) <= checked, (package, set(module._HOMES) - checked)
        assert set(module.__all__) - {"__version__"} == set(module._HOMES), package
