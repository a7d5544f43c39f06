"""The code's shape: no import cycle among kfast's modules (function-level imports and the package
`__init__` files Python runs first included), the topology on the ground floor, one module importing Horovod,
no module over 400 lines, and loader workers that import nothing heavy."""

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


def _lazy_names(tree, modules):
    """{name: module} that a PEP 562 package (one with a module-level `__getattr__`) loads on first use, read
    from its `if TYPE_CHECKING:` imports (test_lazy_names_are_the_ones_type_checkers_see keeps them complete);
    {} for any other module."""
    if not any(isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for f in tree.body):
        return {}
    skipped = _type_checking_blocks(tree)
    return {alias.asname or alias.name: f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
            else node.module
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and id(node) in skipped
            for alias in node.names}


def _run_first(name, modules):
    """What Python runs to import `name`: the module (or, for a name inside one, that module) and before it
    each package's `__init__` on the way, `kfast` included: `from pkg import mod` runs `pkg/__init__.py`."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    out = set()
    while name:
        if name in modules:
            out.add(name)
        name = name.rpartition(".")[0]
    return out


def _attribute_chains(tree):
    """[`a`, `b`, `c`] for each outermost `a.b.c` expression in the module."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    chains = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                chains.append([node.id] + parts[::-1])
    return chains


def _imports(module, path, modules, lazy):
    """kfast modules that importing `module` (at `path`) runs: what it imports at module level and inside
    functions (a lazy import hides a cycle, it does not remove it), each with every package `__init__`
    Python runs first, and the home of each name it takes from a PEP 562 package (`lazy`: {package:
    {name: home}}), whether by `from pkg import Name` or as `pkg.Name` after `import pkg`. Not imports under
    `if TYPE_CHECKING:`, which never run. Its own packages are left out: they started before it."""
    tree = ast.parse(_read(path))
    skipped = _type_checking_blocks(tree)
    out, bound = set(), {}  # bound: {local name: the kfast module it names}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                out |= _run_first(alias.name, modules)
                bound[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else \
                    alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                home = child if child in modules else lazy.get(node.module, {}).get(alias.name, node.module)
                out |= _run_first(node.module, modules) | _run_first(home, modules)
                if child in modules:
                    bound[alias.asname or alias.name] = child
    for root, *attrs in _attribute_chains(tree):
        name = bound.get(root)
        for attr in attrs if name else ():
            child = f"{name}.{attr}"
            home = child if child in modules else lazy.get(name, {}).get(attr)
            if home is None:
                break
            out |= _run_first(home, modules)
            if home != child:  # a function or class: what follows are its attributes
                break
            name = child
    return out - _run_first(module, modules)


def _lazy(modules):
    """{package: {name: home}} for each PEP 562 package."""
    return {m: names for m, p in modules.items() if (names := _lazy_names(ast.parse(_read(p)), modules))}


def _graph():
    """{module: the kfast modules importing it runs}."""
    modules = _modules()
    lazy = _lazy(modules)
    return {m: _imports(m, p, modules, lazy) for m, p in modules.items()}


def test_the_cycle_check_counts_what_python_runs(tmp_path):
    """`from pkg import mod` runs `pkg/__init__.py` first, and each parent's; a PEP 562 package loads a
    name's home when that name is asked for (`from pkg import Name`, or `pkg.Name`), not when a sibling is."""
    modules = _modules()
    lazy = _lazy(modules)
    probe = tmp_path / "probe.py"
    probe.write_text("from kfast.distributed import _horovod\nimport kfast.data._workers.ring\n")
    assert _imports("kfast.cli.probe", probe, modules, lazy) == {
        "kfast.distributed", "kfast.distributed._horovod", "kfast.data", "kfast.data._workers",
        "kfast.data._workers.ring"}
    probe.write_text("from kfast.data import FastLoader\nimport kfast\n\ndef f():\n    kfast.distributed.rank()\n")
    assert _imports("kfast.cli.probe", probe, modules, lazy) == {
        "kfast.data", "kfast.data.loader", "kfast.distributed", "kfast.distributed.collectives"}
    # A module's own packages started running before it did: they are not edges.
    probe.write_text("from kfast.distributed import _horovod\n")
    assert _imports("kfast.distributed.probe", probe, modules, lazy) == {"kfast.distributed._horovod"}


# Import edges the cycle check leaves out, each with its reason. Keep this empty unless one must stay.
ALLOWED = set()


def test_no_import_cycle_among_kfast_modules():
    graph = {m: deps - {d for a, d in ALLOWED if a == m} for m, deps in _graph().items()}
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
    # The ground floor: the topology imports nothing of kfast; the JAX engine only the topology and Slurm's count
    # lists, Horovod's module only the topology; the router (NOTE [ The engine boundary ]) the topology and both.
    assert graph["kfast._core.topology"] == set()
    assert graph["kfast.distributed._jax"] == {"kfast._core", "kfast._core.topology", "kfast.cluster",
                                               "kfast.cluster.nodelist"}
    assert graph["kfast.distributed._horovod"] == {"kfast._core", "kfast._core.topology"}
    assert graph["kfast.distributed.collectives"] == {"kfast._core", "kfast._core.topology",
                                                      "kfast.distributed._horovod", "kfast.distributed._jax"}


# Modules that import an engine's module itself rather than the router, each with its reason.
ENGINE_IMPORTERS = {
    "kfast.distributed.collectives": "the router",
    "kfast.distributed.elastic": "Horovod's elastic driver (elastic_api, restart), which only Horovod has",
    "kfast.env.horovod_build": "reports the Horovod build (import_horovod)",
    "kfast.cluster.jax_processes": "the JAX launcher sets the variables the JAX engine reads (their names)",
}


def test_every_caller_reaches_the_engines_through_the_router():
    graph = _graph()
    engines = {"kfast.distributed._horovod", "kfast.distributed._jax"}
    importers = {m for m, deps in graph.items() if deps & engines} - engines
    assert importers == set(ENGINE_IMPORTERS), importers


def test_no_module_is_over_400_lines():
    lines = {m: len(_read(p).splitlines()) for m, p in _modules().items()}
    assert not {m: n for m, n in lines.items() if n > 400}


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
    for package in ("kfast", "kfast.data", "kfast.distributed"):
        module = importlib.import_module(package)
        tree = ast.parse(_read(module.__file__))
        checked = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   for alias in node.names if id(node) in _type_checking_blocks(tree)}
        assert set(module._HOMES) <= checked, (package, set(module._HOMES) - checked)
        assert set(module.__all__) - {"__version__"} == set(module._HOMES), package


def test_no_heap_scans_or_stack_frames_for_control_flow():
    # State has an owner to ask (issue 34): no search of the live objects for Keras's lists or adapters, and no
    # reading of who called. Thread stacks for an error message (a stuck worker's) are not control flow.
    banned = ("gc.get_objects", "gc.get_referrers", "sys._getframe", "inspect.stack", "inspect.currentframe")
    found = [f"{name}: {word}" for name, path in _modules().items() for word in banned if word in _read(path)]
    assert not found
