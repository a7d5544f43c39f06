"""The memory XLA itself plans for a model's training step, under Keras on JAX: the second source beside
kfast's own prediction.

Keras's JAX trainer compiles `model.train_step(state, data)` with the state donated (`donate_argnums=0`):
the new weights and optimizer state are written over the old. `compiled_step_memory` lowers and compiles
that same step, for the batch's shapes (nothing runs, no batch is allocated) and reads XLA's
`memory_analysis()`: the bytes of its arguments (weights, optimizer and metric state, the batch), of its
outputs, of the outputs written over donated arguments (alias), and of its working memory (temp). On CPU,
XLA's own `peak_memory_in_bytes` counts the arguments alone (checked with jax 0.10.2); what the step holds
at once is arguments + temp + the outputs that are not aliased, which `total` adds up.
"""

from __future__ import annotations

from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kfast._core import fit_timing
from kfast.planning.cost_model import human_bytes


@dataclass(frozen=True)
class CompiledStepMemory:
    """XLA's memory analysis of a compiled training step, in bytes.

    Attributes:
        argument: weights, optimizer and metric state, and the batch.
        output: new weights and state, and the logs.
        alias: outputs written over donated arguments.
        temp: the step's working memory (gradients, activations, XLA's temporaries).
        xla_peak: XLA's own `peak_memory_in_bytes` (on CPU, the arguments alone).
        device: the device it was compiled for.

    Example:

    >>> CompiledStepMemory(argument=100, output=60, alias=50, temp=30, xla_peak=100, device="cpu").total
    140
    """

    argument: int
    output: int
    alias: int
    temp: int
    xla_peak: int
    device: str

    @property
    def total(self) -> int:
        """Arguments, working memory, and the outputs not written over a donated argument."""
        return self.argument + self.temp + self.output - self.alias

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def __str__(self) -> str:
        return (f"XLA's compiled step ({self.device}): {human_bytes(self.total)} = arguments "
                f"{human_bytes(self.argument)} + working memory {human_bytes(self.temp)} + outputs not aliased "
                f"{human_bytes(self.output - self.alias)}")


def _spec(array: Any, batch_size: int | None) -> Any:
    import jax

    shape = tuple(np.shape(array))
    if batch_size is not None and shape:
        shape = (batch_size,) + shape[1:]
    return jax.ShapeDtypeStruct(shape, keras.backend.standardize_dtype(array.dtype))


def compiled_step_memory(model: keras.Model, batch: Any, *, batch_size: int | None = None) -> CompiledStepMemory:
    """Compiles `model`'s training step as Keras's JAX trainer does and returns XLA's memory analysis.

    Args:
        model: a compiled Keras model (built, or built here from `batch` as `fit` would).
        batch: one batch as `fit` gets it (`(x, y)` or `(x, y, sample_weight)`), for its shapes and dtypes.
        batch_size: compile for this many samples instead of the batch's own. Defaults to `None`.

    Returns:
        A `CompiledStepMemory`.

    Raises:
        RuntimeError: when Keras does not run on JAX.

    Example:

    >>> model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
    ...                           keras.layers.Dense(10)])
    >>> model.compile("adam", "mse")
    >>> batch = (np.zeros((64, 256), "float32"), np.zeros((64, 10), "float32"))
    >>> if keras.backend.backend() == "jax":  # XLA's analysis is read on JAX only
    ...     step = compiled_step_memory(model, batch)
    ...     print(step.total > step.argument > 3 * 4 * model.count_params())  # weights, Adam's 2 slots, batch
    ... else:
    ...     print(True)
    True
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise RuntimeError(f"compiled_step_memory reads XLA's analysis of the step Keras compiles on JAX; Keras "
                           f"runs on {backend!r} here. Run with KERAS_BACKEND=jax (and jax installed).")
    import jax

    fit_timing.build_from_batch(model, batch, "compiled_step_memory", metrics=True)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables])
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    data = tuple(keras.tree.map_structure(lambda a: _spec(a, batch_size), part)
                 for part in (x, y, sample_weight) if part is not None)
    compiled = jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()
    analysis = compiled.memory_analysis()
    return CompiledStepMemory(
        argument=int(analysis.argument_size_in_bytes), output=int(analysis.output_size_in_bytes),
        alias=int(analysis.alias_size_in_bytes), temp=int(analysis.temp_size_in_bytes),
        xla_peak=int(analysis.peak_memory_in_bytes), device=str(jax.devices()[0].device_kind))
