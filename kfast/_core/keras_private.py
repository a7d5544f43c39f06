"""Every name kfast takes from Keras's private tree (`keras.src`), in one place.

Keras brings a foreign loader into `fit`, `evaluate` and `predict` through a data adapter: `get_data_adapter`
passes an instance of its `DataAdapter` through as is ("Allow passing a custom data adapter"), as Keras's own
`GrainDatasetAdapter` and `TorchDataLoaderAdapter` bring Grain and PyTorch loaders in. `DataAdapter` and the
helpers that turn an adapter's batches into each backend's form live under `keras.src` only, so they are
imported here and nowhere else; tests/data/test_keras_seam.py fails when a Keras release moves or renames one.
Keras 3.16 stacks several steps' batches for `steps_per_execution > 1` on JAX (`get_jax_iterator(super_batch=)`,
with `super_batch_iterator`); earlier releases have neither, which `super_batch_iterator` being None says.

The second part reads what Keras keeps private of a model's structure, without changing any of it: the layers a
layer holds (`sublayers`) and the graph Keras records of a call on KerasTensors (`symbolic_calls`), for the
memory estimate (kfast.planning.layer_calls) and the check that a model is built (kfast._core.fit_timing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.data_adapters.data_adapter import DataAdapter

__all__ = ["DataAdapter", "class_weight_to_sample_weights", "jax_iterator", "numpy_iterator", "tensor_spec",
           "torch_dataloader", "SPEC_BATCHES", "super_batch_iterator", "SymbolicCall", "compiled_loss_and_metrics_built",
           "sublayers", "symbolic_build", "symbolic_calls"]

# Batches Keras looks at to find the tf.data signature of a PyDataset (its own adapter's number).
SPEC_BATCHES: int = data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC
numpy_iterator = data_adapter_utils.get_numpy_iterator
jax_iterator = data_adapter_utils.get_jax_iterator
torch_dataloader = data_adapter_utils.get_torch_dataloader
tensor_spec = data_adapter_utils.get_tensor_spec
class_weight_to_sample_weights = data_adapter_utils.class_weight_to_sample_weights
super_batch_iterator: Any = getattr(data_adapter_utils, "super_batch_iterator", None)  # Keras 3.16 on


# --- A model's layers and the graph of a symbolic call (kfast.planning.layer_calls, kfast._core.fit_timing) ---


def sublayers(layer: Any, recursive: bool = False) -> list[Any]:
    """The layers `layer` holds as its own (in attributes, lists or dicts), itself excluded; with `recursive`,
    theirs too.

    Keras private: `Layer._flatten_layers`. `Model.layers` lists a model's own layers, but a plain layer that
    calls others (`MultiHeadAttention`, a user's block) has no public list of them. kfast reads it to tell a
    layer that calls others from one that does not (kfast.planning.layer_calls looks inside the first kind
    only), and to check that every layer of a model is built (kfast._core.fit_timing).

    Example:

    >>> attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> _ = attention(np.zeros((1, 3, 8)), np.zeros((1, 3, 8)))  # built: its sublayers exist
    >>> [type(layer).__name__ for layer in sublayers(attention)], sublayers(keras.layers.Dense(1))
    (['EinsumDense', 'EinsumDense', 'EinsumDense', 'Softmax', 'Dropout', 'EinsumDense'], [])
    """
    return list(layer._flatten_layers(include_self=False, recursive=recursive))


@dataclass(frozen=True)
class SymbolicCall:
    """One operation call recorded in a graph of KerasTensors: the operation (a layer, or a `keras.ops`
    operation), the arguments it was called with (as given to `__call__`), and the KerasTensors it returned."""

    operation: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[Any]


def symbolic_calls(inputs: list[Any], outputs: list[Any]) -> list[SymbolicCall]:
    """Every operation call that made `outputs` from `inputs` (KerasTensors), each after the calls that made its
    arguments: depth first from `outputs`, arguments in order (the order a layer's code computes them in when
    it computes them in the order it passes them).

    Keras private: the graph Keras records when a layer or an operation is called on KerasTensors (the
    functional API's graph): `KerasTensor._keras_history` names the call that made a tensor, as
    `Operation._inbound_nodes[node_index]`, a `Node` whose `arguments.args`, `arguments.kwargs`, `operation` and
    `outputs` are read here. `keras.Model(inputs, outputs)` builds from this graph too, but gives its calls
    back only by running each of them again (`keras.models.clone_model(call_function=...)`, which adds a call
    to every layer and builds another model); kfast.planning.layer_calls reads the calls a layer's `call()`
    makes, to follow the layers it calls.

    Example:

    >>> x = keras.KerasTensor((2, 3))
    >>> dense = keras.layers.Dense(4)
    >>> [(type(c.operation).__name__, tuple(c.outputs[0].shape)) for c in symbolic_calls([x], [dense(x) * 2])]
    [('Dense', (2, 4)), ('Multiply', (2, 4))]
    """
    stop = {id(t) for t in inputs}
    done: set[int] = set()
    calls: list[SymbolicCall] = []
    # Iterative depth-first search (a deep model would pass Python's recursion limit): (node, arguments left).
    stack: list[tuple[Any, list[Any]]] = []

    def node_of(tensor: Any) -> Any:
        history = getattr(tensor, "_keras_history", None)
        if id(tensor) in stop or history is None or history.operation is None:
            return None
        return history.operation._inbound_nodes[history.node_index]

    for tensor in outputs:
        node = node_of(tensor)
        if node is None or id(node) in done:
            continue
        done.add(id(node))
        stack.append((node, list(node.arguments.keras_tensors)))
        while stack:
            node, pending = stack[-1]
            while pending:
                parent = node_of(pending.pop(0))
                if parent is not None and id(parent) not in done:
                    done.add(id(parent))
                    stack.append((parent, list(parent.arguments.keras_tensors)))
                    break
            else:
                stack.pop()
                calls.append(SymbolicCall(node.operation, tuple(node.arguments.args), dict(node.arguments.kwargs),
                                          list(node.outputs)))
    return calls


# --- Building what fit builds from its first batch (kfast._core.fit_timing) ---


def symbolic_build(model: Any, batch: Any) -> None:
    """Builds `model`'s variables, compiled loss and metrics and optimizer from `batch`, as `fit` does before its
    first step. Keras private: `Trainer._symbolic_build`, the one routine that builds all of them together;
    kfast needs it before a resumed epoch's first step (restore) and before diagnosing an unbuilt model."""
    model._symbolic_build(data_batch=batch)


def compiled_loss_and_metrics_built(model: Any) -> bool:
    """Whether the loss and metrics `compile` gave are built (Keras's JAX fit otherwise builds them from a first
    look at the data). Keras private: `Trainer._compile_loss` and `_compile_metrics`, which hold them."""
    return all(getattr(model, name, None) is None or getattr(model, name).built
               for name in ("_compile_metrics", "_compile_loss"))
