"""Which layers a model's forward pass calls, read from the graph Keras records of a symbolic call.

`trace` runs the model's training-mode forward pass once on KerasTensors (no memory, no compute) and records
every layer call, nested ones included: what went in and what came out, shapes and dtypes as the backend
infers them. kfast.planning.activations turns the calls into what the backward pass keeps.

NOTE [ Reading the layer calls ]
Nothing of Keras is replaced or wrapped: the calls are read from the graph Keras records when layers and
`keras.ops` are called on KerasTensors (the functional API's graph), one layer at a time, from the model down.
  - `_Body` runs a layer's own `call()` on KerasTensors inside Keras's `__call__`, so with the layer's dtype
    policy (its autocast scope) and the `training` its sublayers inherit. `keras_private.symbolic_calls` reads
    back the calls it made, each after those that made its arguments.
  - A layer that holds others (a model, `MultiHeadAttention`, a user's block) is read the same way, on the
    arguments its caller gave it; its calls become its children. One whose `call()` does not run on
    KerasTensors (a loop over time steps, a backend function) counts as one layer, as any other does.
  - The graph is built with the batch unknown, as a functional model's is, so that Keras's records of the
    calls read as before (`model.summary()` shows the shapes of a layer's last call); code that needs the batch
    gets a second try with it. The shapes recorded are the backend's at the traced batch, as Keras infers them
    by default (`_Shapes`): a layer's own `compute_output_shape` may leave a dimension unknown (`EinsumDense`
    does).
  - All of it runs in a `keras.StatelessScope`: a variable update the code attempts does not land.
Keras names the operations a layer's code makes as it names layers (`x + y` makes an `Add`), so a name drawn
after a trace may come later in its sequence ("add_1" where "add" was next).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import keras

from kfast._core import keras_private

# keras.ops conversions, which a backend skips for a tensor that has the dtype asked for.
_CONVERSIONS = {"ConvertToTensor", "Cast"}


@dataclass
class LayerCall:
    """One call of a layer (or of an operation between a functional model's layers): the tensors that went in
    and came out, and the calls it made, in order.

    Example:

    >>> call = LayerCall(keras.layers.Dense(2, name="d"), inputs=[keras.KerasTensor((4, 3))])
    >>> call.layer.name, call.children
    ('d', [])
    """

    layer: Any
    inputs: list[Any]
    outputs: list[Any] = field(default_factory=list)
    children: list[LayerCall] = field(default_factory=list)
    unread: bool = False  # it holds layers, but its call() does not run on KerasTensors: counted as one
    training: bool | None = None  # the `training` it was called with (False: inference mode, as when frozen)


@dataclass(frozen=True)
class _Arguments:
    """A call's arguments as one value that is not a tensor: Keras hands it to `_Body.call` as it is."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Body(keras.layers.Layer):
    """Runs `layer`'s own `call()` inside Keras's `__call__`, with `layer`'s dtype policy and autocast."""

    def __init__(self, layer: keras.layers.Layer) -> None:
        super().__init__(name=f"kfast_{layer.name}", dtype=layer.dtype_policy, autocast=layer.autocast)
        self._call_of = layer.call
        self._passes_training = "training" in inspect.signature(layer.call).parameters

    def call(self, arguments: _Arguments, training: bool | None = None) -> Any:
        kwargs = {k: v for k, v in arguments.kwargs.items() if k != "training"}
        if self._passes_training:
            kwargs["training"] = training
        return self._call_of(*arguments.args, **kwargs)


class _Shapes(keras.Operation):
    """`compute_output_spec` calls `layer` on the backend's symbolic tensors (Keras's default inference)."""

    def __init__(self, layer: keras.layers.Layer) -> None:
        super().__init__(name=f"kfast_{layer.name}")
        self._call_of = layer.__call__

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self._call_of(*args, **kwargs)


def _tensors(structure: Any) -> list[Any]:
    return [t for t in keras.tree.flatten(structure) if hasattr(t, "shape") and hasattr(t, "dtype")]


def _symbolic(structure: Any) -> list[Any]:
    """The distinct KerasTensors in `structure`, in order."""
    return list({id(t): t for t in keras.tree.flatten(structure) if isinstance(t, keras.KerasTensor)}.values())


def _stand_in(t: Any, batch: bool) -> Any:
    shape = tuple(t.shape) if batch or not t.shape else (None, *t.shape[1:])
    return keras.KerasTensor(shape, t.dtype, sparse=t.sparse, ragged=t.ragged)


def _graph(layer: Any, given: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any], training: bool,
           batch: bool) -> tuple[dict[int, Any], Any]:
    """Runs `layer.call` on stand-ins of the `given` KerasTensors, their batch unknown unless `batch`, so that
    the calls it makes record Keras's graph; returns the stand-ins (by the id of the tensor each stands for) and
    what `call` returned."""
    stand_in = {id(t): _stand_in(t, batch) for t in given}
    swapped = keras.tree.map_structure(lambda v: stand_in.get(id(v), v), (tuple(args), dict(kwargs)))
    return stand_in, _Body(layer)(arguments=_Arguments(*swapped), training=training)


def _same(inputs: list[Any], outputs: list[Any]) -> bool:
    dtype = keras.backend.standardize_dtype
    return len(inputs) == len(outputs) == 1 and tuple(inputs[0].shape) == tuple(outputs[0].shape) and (
        dtype(inputs[0].dtype) == dtype(outputs[0].dtype))


class _Tracer:
    """Reads the layer calls of `model`'s forward pass; `calls` holds them all, each after the calls it made."""

    def __init__(self, model: keras.Model) -> None:
        # Operations between layers in a functional model (`x + y`, a residual's add) are calls too.
        self.operations = {id(op) for op in getattr(model, "operations", []) if not isinstance(op, keras.layers.Layer)}
        self.calls: list[LayerCall] = []

    def body(self, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], training: bool,
             top: bool = False) -> tuple[list[LayerCall], Any]:
        """The calls that `layer`'s `call()` makes on `args` and `kwargs`, and its outputs."""
        given = _symbolic((args, kwargs))
        try:
            stand_in, made = _graph(layer, given, args, kwargs, training, batch=False)
        except Exception:  # code that computes a shape from the batch gets it
            try:
                stand_in, made = _graph(layer, given, args, kwargs, training, batch=True)
            except Exception as e:
                if not top:
                    raise
                raise ValueError(f"model {layer.name!r}'s call() does not run on KerasTensors, which kfast calls it "
                                 "on to read the layers it calls (as Keras's functional API does); use keras.ops in "
                                 f"call(), not NumPy or the backend's own functions. Keras said: {type(e).__name__}: "
                                 f"{e}") from e
        exact = {id(stand_in[id(t)]): t for t in given}  # a tensor of the graph: the one at the traced batch
        children = []
        for call in keras_private.symbolic_calls(list(stand_in.values()), _symbolic(made)):
            op = call.operation
            a, kw = keras.tree.map_structure(lambda v: exact.get(id(v), v), (call.args, call.kwargs))
            if isinstance(op, keras.layers.Layer):
                kw = {**kw, "training": training if kw.get("training") is None else kw["training"]}
                inner, out = self.layer_call(op, a, kw)
                unread = not inner and bool(keras_private.sublayers(op))
            else:
                inner, out = [], op.compute_output_spec(*a, **kw)
                if type(op).__name__ in _CONVERSIONS and _same(_tensors(a), _tensors(out)):
                    out = _tensors(a)[0]
            if isinstance(op, keras.layers.Layer) or top and id(op) in self.operations:
                layer = isinstance(op, keras.layers.Layer)
                children.append(LayerCall(op, _tensors((a, kw)), _tensors(out), inner, unread=layer and unread,
                                          training=kw.get("training") if layer else None))
                self.calls.append(children[-1])
            exact.update((id(graph), t) for graph, t in zip(call.outputs, keras.tree.flatten(out)))
        return children, keras.tree.map_structure(lambda v: exact.get(id(v), v), made)

    def layer_call(self, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[LayerCall], Any]:
        if keras_private.sublayers(layer):
            recorded = len(self.calls)
            try:
                return self.body(layer, args, kwargs, kwargs["training"])
            except Exception:  # its call() does not run on KerasTensors: one layer, as any other
                del self.calls[recorded:]
        try:
            return [], _Shapes(layer).compute_output_spec(*args, **kwargs)
        except Exception:
            if not isinstance(layer, keras.layers.MultiHeadAttention):
                raise
            # A subclass whose call() takes arguments Keras's own shape inference does not (KerasHub's cached
            # attention): its output is shaped by the public rule of the layer it extends.
            query = args[0] if args else kwargs["query"]
            value = args[1] if len(args) > 1 else kwargs.get("value", query)
            return [], keras.KerasTensor(layer.compute_output_shape(query.shape, value.shape), query.dtype)


def trace(model: keras.Model, x_spec: Any) -> tuple[list[LayerCall], list[Any]]:
    """Every layer call of one training-mode forward pass of `model` on `x_spec` (KerasTensors of a fixed
    batch), outermost calls last, and the model's inputs among their tensors (see NOTE [ Reading the layer
    calls ]).

    Raises:
        ValueError: when `model`'s `call()` does not run on KerasTensors.

    Example:

    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu", name="h"),
    ...                           keras.layers.Dense(2, name="o")])
    >>> calls, inputs = trace(model, keras.KerasTensor((16, 8)))
    >>> [(call.layer.name, tuple(call.outputs[0].shape)) for call in calls]
    [('h', (16, 4)), ('o', (16, 2))]
    """
    tracer = _Tracer(model)
    with keras.StatelessScope():
        tracer.body(model, (x_spec,), {}, training=True, top=True)
    return tracer.calls, _tensors(x_spec)
