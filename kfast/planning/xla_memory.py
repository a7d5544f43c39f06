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
from kfast.planning import deviceless
from kfast.planning import gpus
from kfast.planning import layouts
from kfast.planning.cost_model import human_bytes


@dataclass(frozen=True)
class CompiledStepMemory:
    """XLA's memory analysis of a compiled training step, in bytes.

    Attributes:
        argument: weights, optimizer and metric state, and the batch.
        output: new weights and state, and the logs.
        alias: outputs written over donated arguments.
        temp: the step's working memory (gradients, activations, XLA's temporaries).
        xla_peak: XLA's own `peak_memory_in_bytes` (on CPU, the arguments alone; on a GPU the heap
            simulation's peak, which leaves out that the runtime allocates the working memory as one block).
        device: the device it was compiled for.
        devices: how many such devices the step was split over; every number is per device.

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
    devices: int = 1

    @property
    def total(self) -> int:
        """Arguments, working memory, and the outputs not written over a donated argument."""
        return self.argument + self.temp + self.output - self.alias

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def __str__(self) -> str:
        where = self.device if self.devices == 1 else f"per device of {self.devices} x {self.device}"
        return (f"XLA's compiled step ({where}): {human_bytes(self.total)} = arguments "
                f"{human_bytes(self.argument)} + working memory {human_bytes(self.temp)} + outputs not aliased "
                f"{human_bytes(self.output - self.alias)}")


def _batch_spec(array: Any, batch_size: int | None, sharding: Any) -> Any:
    import jax

    shape = tuple(np.shape(array))
    if batch_size is not None and shape:
        shape = (batch_size,) + shape[1:]
    dtype = keras.backend.standardize_dtype(array.dtype)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) if sharding else jax.ShapeDtypeStruct(shape, dtype)


def _state(model: keras.Model, target: Any) -> tuple[Any, ...]:
    """The step's state as Keras's JAX trainer passes it, as values (this machine) or as shapes laid on `target`'s
    mesh: a kernel split as kfast's layout map splits it, its optimizer slots with it, everything else replicated."""
    parts = (model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
             model.metrics_variables)
    if target is None:
        return tuple([v.value for v in part] for part in parts)
    import jax

    mesh, replicated = target
    axes = layouts.variable_axes(model, mesh.shape["model"]) if mesh.shape["model"] > 1 else {}
    # Keras names an optimizer slot after its variable's path ("dense/kernel" -> "dense_kernel_momentum").
    slots = {path.replace("/", "_"): a for path, a in axes.items()}

    def spec(v: Any) -> Any:
        a = axes.get(v.path) or next((a for prefix, a in slots.items() if v.name.startswith(prefix + "_")
                                      and len(a) == len(v.shape)), None)
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*a)) if a else replicated
        return jax.ShapeDtypeStruct(tuple(v.shape), keras.backend.standardize_dtype(v.dtype), sharding=sharding)

    return tuple([spec(v) for v in part] for part in parts)


def compiled_step_memory(model: keras.Model, batch: Any, *, batch_size: int | None = None,
                         device: str | None = None, mesh: tuple[int, int] = (1, 1)) -> CompiledStepMemory:
    """Compiles `model`'s training step as Keras's JAX trainer does and returns XLA's memory analysis.

    Args:
        model: a compiled Keras model (built, or built here from `batch` as `fit` would).
        batch: one batch as `fit` gets it (`(x, y)` or `(x, y, sample_weight)`), for its shapes and dtypes.
        batch_size: compile for this many samples per data-parallel replica instead of the batch's own.
            Defaults to `None`.
        device: compile for this GPU (`"H100"`, `"A100-40GB"`: `kfast.planning.gpus.known_gpus()`), with no
            GPU here. Defaults to `None`: this machine's device.
        mesh: `(data, model)` devices of `device`: the batch split over "data", kernels over "model" as
            `kfast.planning.propose_layout_map` lays them out; the numbers are per device. Defaults to `(1, 1)`.

    Returns:
        A `CompiledStepMemory`.

    Raises:
        RuntimeError: when Keras does not run on JAX.
        ValueError: for an unknown GPU name, or a mesh on this machine's device.
        GpuCompileUnavailable: when the GPU compile's packages are missing (the message says what to install).

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
                           f"runs on {backend!r} here. Run with KERAS_BACKEND=jax (and jax installed), or use "
                           "kfast.planning.estimate_memory(..., device=...), which compiles in a JAX process.")
    import jax

    spec = gpus.gpu_spec(device) if device is not None else None
    placement = deviceless.Placement(*mesh)
    if spec is None and placement.devices > 1:
        raise ValueError(f"compiled_step_memory got mesh={mesh!r} without device=; a mesh is compiled for a named "
                         "GPU (device='H100'), whose devices this machine need not have.")
    fit_timing.build_from_batch(model, batch, "compiled_step_memory", metrics=True)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    target = deviceless.shardings(spec, placement) if spec else None
    split = None
    if target is not None:
        split = jax.sharding.NamedSharding(target[0], jax.sharding.PartitionSpec("data"))
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    size = None if batch_size is None else batch_size * placement.data
    if size is None and placement.data > 1:
        size = int(np.shape(keras.tree.flatten(x)[0])[0]) * placement.data
    data = tuple(keras.tree.map_structure(lambda a: _batch_spec(a, size, split), part)
                 for part in (x, y, sample_weight) if part is not None)
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(_state(model, target), data)
    try:
        analysis = lowered.compile().memory_analysis()
    except Exception as e:
        if spec is None:
            raise
        raise deviceless.compile_error(spec, e) from e
    if analysis is None:
        where = spec.name if spec else "this machine"
        raise RuntimeError(f"XLA gave no memory analysis for the step compiled for {where}; this jaxlib's backend "
                           "does not report one.")
    kind = spec.description if spec else str(jax.devices()[0].device_kind)
    return CompiledStepMemory(
        argument=int(analysis.argument_size_in_bytes), output=int(analysis.output_size_in_bytes),
        alias=int(analysis.alias_size_in_bytes), temp=int(analysis.temp_size_in_bytes),
        xla_peak=int(analysis.peak_memory_in_bytes), device=kind, devices=placement.devices)
