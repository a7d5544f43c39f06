"""kfast never replaces what Keras owns at run time (STYLE.md, "Plug into the framework's seams; never patch
it"): a scan of the source of every module of kfast, kfast.callbacks and kfast.recipes finds no assignment to an
attribute of a Keras class, module or object, and `keras.src` imported nowhere but kfast/_core/keras_private.py.

NOTE [ What the scan flags ]
  - `object.__setattr__(...)` and `object.__delattr__(...)` (`type.` too), wherever they are;
  - `setattr(target, name, value)` and `delattr(target, name)` where the target starts at a Keras class or
    module, the name is (or runs over) one of Keras Model's or Layer's own attributes, or the value is a Keras
    method (a wrapper of one: `_wrap(getattr(model_class, "fit"))`);
  - `target.attr = ...` (`+=`, `del` and annotated assignments too) where the target starts at a Keras class or
    module (`keras.Model.evaluate`, an adapter class taken from `keras.src`), or `attr` is one of Keras Model's or
    Layer's own attributes (`model.predict_function`), as Keras lists them when the test runs;
  - an import of `keras.src` (or `keras.src` reached through `keras`) outside kfast/_core/keras_private.py.
A Keras class or module is a name imported from `keras` (or from kfast/_core/keras_private.py, which re-exports
Keras's private classes), or a name bound to an attribute of one. Not flagged: a kfast class setting its own
attributes (`self._x = ...`), unless it subclasses a Keras class and replaces one of Keras's methods that way;
`self.model.stop_training = True`, Keras's documented way for a callback to stop training; and
`self.model.jit_compile = False`, the public setter of a compile setting (BroadcastState turns XLA off, with a
warning, since Horovod's collectives have no XLA kernels): a setting through Keras's own property, not a method
or a graph replaced.
"""

import ast
import inspect
import os

import keras

from helpers import REPO

FOLDERS = ("kfast", "callbacks", "recipes")
PRIVATE_MODULE = os.path.join("kfast", "_core", "keras_private.py")
KERAS_PRIVATE = "kfast._core.keras_private"
ALLOWED = {"self.model.stop_training = True", "self.model.jit_compile = False"}


def _keras_attributes():
    """(Keras Model's and Layer's attributes, the methods among them): the classes' and those of a compiled
    functional model and a layer, whose `__init__`, `compile` and `make_*_function` set more."""
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse")
    for make in (model.make_train_function, model.make_test_function, model.make_predict_function):
        make()
    layer = keras.layers.Layer()
    classes = (keras.Model, keras.layers.Layer)
    names = {n for owner in (*classes, model, layer) for n in dir(owner)} - (set(dir(object)) - {"__class__"})
    methods = {n for cls in classes for n in dir(cls) if inspect.isfunction(inspect.getattr_static(cls, n, None))}
    methods |= {n for owner in (model, layer) for n, v in vars(owner).items() if inspect.isroutine(v)}
    return frozenset(names), frozenset(methods)


ATTRIBUTES, METHODS = _keras_attributes()


def _root(node):
    """The name an expression starts at (`keras` for `keras.Model.fit`), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_keras_module(name):
    """Whether the module `name` is Keras's, or kfast's module that hands out Keras's private classes."""
    return any(name == m or name.startswith(m + ".") for m in ("keras", KERAS_PRIVATE))


def _string_constants(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


class _Bindings:
    """What the module's names are bound to, read over the whole module (scopes merged: a lint, not a
    type checker): Keras classes and modules, string constants (also those a loop runs over), Keras methods."""

    def __init__(self, tree):
        self.keras = set()  # names of Keras classes and modules
        self.keras_modules = set()  # names of the `keras` package itself
        self.strings = {}  # name -> the strings it is bound to or runs over
        self.methods = set()  # names bound to a Keras method
        self.kfast_classes = set()  # classes of kfast's own: defined here or imported from kfast
        self.kfast_objects = set()  # names bound to an instance of one (`step = Step(...)`, `step: Step`)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_keras_module(alias.name) and alias.asname:  # import keras.layers as L
                        self.keras.add(alias.asname)
                        self.keras_modules.update([alias.asname] if alias.name == "keras" else [])
                    elif alias.name == "keras" or alias.name.startswith("keras."):  # import keras.src.x: binds keras
                        self.keras.add("keras")
                        self.keras_modules.add("keras")
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    name = alias.asname or alias.name
                    if _is_keras_module(node.module) or _is_keras_module(f"{node.module}.{alias.name}"):
                        self.keras.add(name)
                    elif (node.module + ".").startswith("kfast.") and alias.name[:1].isupper():
                        self.kfast_classes.add(name)
        classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
        for _ in range(3):  # aliases of aliases
            for node in ast.walk(tree):
                for target, value in self._bound(node):
                    if self.is_keras(value):
                        self.keras.add(target)
                    self.strings.setdefault(target, set()).update(self.string_values(value))
                    if self.is_keras_method(value):
                        self.methods.add(target)
        self.keras_classes = set()  # classes of this module that subclass Keras's
        for _ in classes:
            self.keras_classes.update(c.name for c in classes if any(
                _root(b) in self.keras or _root(b) in self.keras_classes for b in c.bases))
        self.kfast_classes.update(c.name for c in classes if c.name not in self.keras_classes)
        for node in ast.walk(tree):
            for target, value in self._bound(node):
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and (
                        value.func.id in self.kfast_classes):
                    self.kfast_objects.add(target)
            if isinstance(node, (ast.arg, ast.AnnAssign)) and _root(node.annotation) in self.kfast_classes:
                self.kfast_objects.add(node.arg if isinstance(node, ast.arg) else _root(node.target))

    @staticmethod
    def _bound(node):
        """(name, value) for a name bound by `name = value` or by `for name in value`."""
        if isinstance(node, ast.Assign):
            return [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            return [(node.target.id, node.value)]
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            return [(node.target.id, node.iter)]
        return []

    def is_keras(self, node):
        """Whether `node` names a Keras class or module: `keras.Model`, `getattr(py_dataset_adapter, "...")`."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            return bool(node.args) and self.is_keras(node.args[0])
        return isinstance(node, (ast.Attribute, ast.Subscript, ast.Name)) and _root(node) in self.keras

    def string_values(self, node):
        if isinstance(node, ast.Name):
            return self.strings.get(node.id, set())
        return _string_constants(node)

    def is_keras_method(self, node):
        """Whether `node` is, or wraps, a Keras method: `x.fit`, `getattr(x, "fit")`, a call given either."""
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and n.attr in METHODS and isinstance(n.ctx, ast.Load):
                return True
            if isinstance(n, ast.Name) and n.id in self.methods:
                return True
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and (
                    len(n.args) > 1 and self.string_values(n.args[1]) & METHODS):
                return True
        return False


class _Scan(ast.NodeVisitor):
    def __init__(self, source, path):
        self.source = source
        self.path = path
        self.tree = ast.parse(source)
        self.names = _Bindings(self.tree)
        self.private_ok = os.path.normpath(path).endswith(PRIVATE_MODULE)
        self.findings = []
        self.scopes = [(None, None)]  # (self's name, whether its class subclasses Keras's), innermost last
        self.visit(self.tree)

    def flag(self, node, why):
        statement = " ".join((ast.get_source_segment(self.source, node) or ast.unparse(node)).split())
        self.findings.append(f"{self.path}:{node.lineno}: {statement}  [{why}]")

    def visit_ClassDef(self, node):
        for child in node.body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.args.args:
                self.scopes.append((child.args.args[0].arg, node.name in self.names.keras_classes))
                self.generic_visit(child)  # not visit_FunctionDef: a method's first argument is its `self`
                self.scopes.pop()
            else:
                self.visit(child)

    def visit_FunctionDef(self, node):
        self.scopes.append((None, None))  # a function inside a method has no `self` of its own
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _own(self, target, attr):
        """Whether `target.attr` is a kfast object's own attribute: `self.attr` in its class's methods, or an
        attribute of an instance of a kfast class."""
        me, keras_class = self.scopes[-1]
        if isinstance(target, ast.Name) and target.id in self.names.kfast_objects:
            return True
        return isinstance(target, ast.Name) and target.id == me and not (keras_class and attr in METHODS)

    def _assigned(self, node, target):
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._assigned(node, t)
        elif isinstance(target, ast.Starred):
            self._assigned(node, target.value)
        elif isinstance(target, ast.Attribute):
            if ast.unparse(node) in ALLOWED:
                return
            if _root(target) in self.names.keras:
                self.flag(node, f"assigns to {ast.unparse(target)}, of a Keras class or module")
            elif target.attr in ATTRIBUTES and not self._own(target.value, target.attr):
                self.flag(node, f"assigns Keras's own attribute {target.attr!r}")

    def visit_Assign(self, node):
        for target in node.targets:
            self._assigned(node, target)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._assigned(node, node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assigned(node, node.target)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for target in node.targets:
            self._assigned(node, target)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__") and (
                isinstance(func.value, ast.Name) and func.value.id in ("object", "type")):
            self.flag(node, f"{func.value.id}.{func.attr} sets an attribute past the object's own rules")
        elif isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and len(node.args) >= 2:
            target, name = node.args[0], node.args[1]
            names = self.names.string_values(name)
            if _root(target) in self.names.keras:
                self.flag(node, f"{func.id} on {ast.unparse(target)}, a Keras class or module")
            elif names & ATTRIBUTES and not all(self._own(target, n) for n in names & ATTRIBUTES):
                self.flag(node, f"{func.id} of Keras's own attribute {sorted(names & ATTRIBUTES)}")
            elif len(node.args) > 2 and self.names.is_keras_method(node.args[2]):
                self.flag(node, f"{func.id} to a Keras method or a wrapper of one")
        elif not self.private_ok and node.args and _string_constants(node.args[0]) and any(
                s == "keras.src" or s.startswith("keras.src.") for s in _string_constants(node.args[0])) and (
                ast.unparse(func) in ("importlib.import_module", "import_module", "__import__")):
            self.flag(node, "imports keras.src outside kfast/_core/keras_private.py")
        self.generic_visit(node)

    def visit_Import(self, node):
        if not self.private_ok and any(a.name == "keras.src" or a.name.startswith("keras.src.") for a in node.names):
            self.flag(node, "imports keras.src outside kfast/_core/keras_private.py")

    def visit_ImportFrom(self, node):
        module = node.module or ""
        private = module == "keras.src" or module.startswith("keras.src.") or (
            module == "keras" and any(a.name == "src" for a in node.names))
        if private and not self.private_ok:
            self.flag(node, "imports keras.src outside kfast/_core/keras_private.py")

    def visit_Attribute(self, node):
        if not self.private_ok and node.attr == "src" and isinstance(node.value, ast.Name) and (
                node.value.id in self.names.keras_modules):
            self.flag(node, "reaches keras.src outside kfast/_core/keras_private.py")
        self.generic_visit(node)


def scan(source, path="<string>"):
    """The findings (`path:line: statement  [why]`) in one module's source (see NOTE [ What the scan flags ])."""
    return _Scan(source, path).findings


def _modules():
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(dirpath, name), REPO)


def test_no_module_replaces_what_keras_owns_or_imports_keras_src():
    findings = []
    for path in _modules():
        with open(os.path.join(REPO, path)) as f:
            findings += scan(f.read(), path)
    assert not findings, "kfast assigns to what Keras owns:\n" + "\n".join(findings)


def test_the_scan_finds_a_replaced_method_and_a_call_swapped_on_an_instance():
    replaced = "import keras\n\n\ndef fit(*args, **kwargs):\n    pass\n\n\nkeras.Model.fit = fit\n"
    assert scan(replaced, "a.py") == ["a.py:8: keras.Model.fit = fit  [assigns to keras.Model.fit, of a Keras "
                                      "class or module]"]
    swapped = "def trace(layer, record):\n    object.__setattr__(layer, \"call\", record(layer.call))\n"
    assert [f.split("  [")[0] for f in scan(swapped, "b.py")] == [
        "b.py:2: object.__setattr__(layer, \"call\", record(layer.call))"]


def test_the_scan_finds_the_patches_kfast_used_to_make_and_leaves_its_own_attributes_alone():
    patches = '''
from keras.src.trainers.data_adapters import py_dataset_adapter
KINDS = ("fit", "evaluate")

def install(model_class, wrap):
    for kind in ("evaluate", "predict"):
        setattr(model_class, kind, wrap(getattr(model_class, kind)))
    for kind in KINDS:
        setattr(model_class, kind, None)
    adapter = py_dataset_adapter.PyDatasetAdapter
    adapter._get_iterator = wrap(adapter._get_iterator)

def gather(model, step):
    model.predict_function = step
    setattr(model, "train_function", step)
    model.optimizer = None
'''
    lines = [int(f.split(":")[1]) for f in scan(patches, "p.py")]
    assert lines == [2, 7, 9, 11, 14, 15, 16], scan(patches, "p.py")
    own = '''
import keras

class Warmup(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self._epoch = 0
        self.name = "warmup"

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True
        self.model.optimizer.learning_rate = 0.1

class Settings:
    def __init__(self, dtype):
        self.dtype = dtype

def copy(out, dataset):
    for name, value in vars(dataset).items():
        setattr(out, name, value)
'''
    assert scan(own, "o.py") == []
