"""`estimate_memory`: one device's memory for a training step, predicted here or compiled for a named GPU."""

from __future__ import annotations

from typing import Any
from typing import overload

import keras
import numpy as np

from kfast.planning.device_memory import DeviceMemory
from kfast.planning.device_memory import plan_device_memory
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.memory_model import MemoryModel
from kfast.planning.memory_model import batch_rows
from kfast.planning.step_variants import StepVariant


@overload
def estimate_memory(model: keras.Model, batch: Any = None, *, batch_size: int | None = None,
                    precision: str | None = None, accumulation: int | None = None,
                    mesh: tuple[int, int] = (1, 1), device: None = None, method: str | None = None
                    ) -> MemoryBreakdown: ...


@overload
def estimate_memory(model: keras.Model, batch: Any = None, *, batch_size: int | None = None,
                    precision: str | None = None, accumulation: int | None = None,
                    mesh: tuple[int, int] = (1, 1), device: str, method: str | None = None) -> DeviceMemory: ...


def estimate_memory(model: keras.Model, batch: Any = None, *, batch_size: int | None = None,
                    precision: str | None = None, accumulation: int | None = None,
                    mesh: tuple[int, int] = (1, 1), device: str | None = None,
                    method: str | None = None) -> MemoryBreakdown | DeviceMemory:
    """Predicts what one device holds at the peak of a training step of `model`, here or on a named GPU.

    Without `device`: kfast's analytical breakdown for this machine's device. With `device="H100"` (any of
    `kfast.planning.gpus.known_gpus()`): the step `fit` would run, compiled by XLA for that GPU without one here
    (Keras's own JAX train step, state donated, whatever backend Keras runs on here), XLA's numbers per device,
    the runtime's margin, whether it fits, and when it does not, each change compiled for the same GPU.

    Parameters, gradients and the optimizer's own slots (Adam 2 per value, SGD with momentum 1, ...);
    the activations the backward pass keeps, read from the model's layers on symbolic tensors (nothing
    runs, nothing is allocated); and the batch. See `MemoryBreakdown` for each part.

    Args:
        model: a compiled Keras model, built (with `keras.Input`, or called once).
        batch: one batch as `fit` gets it, for its shapes and dtypes. Defaults to `None`: the model's
            `keras.Input`s and float32 targets shaped like its output.
        batch_size: samples per optimizer step on one data-parallel replica. Defaults to `None`: the
            batch's own size, or 32.
        precision: a Keras dtype policy: `"float32"`, `"mixed_float16"` or `"mixed_bfloat16"`. Defaults to
            `None`: the model's own.
        accumulation: backward passes per optimizer step; the batch splits into micro-batches of
            `batch_size / accumulation`. Defaults to `None`: the optimizer's own (1 unless it accumulates).
        mesh: `(data, model)` devices: kernels split over the model axis as
            `kfast.planning.propose_layout_map` lays them out. Defaults to `(1, 1)`: data parallel.
        device: a GPU by name (`"H100"`, `"A100-40GB"`, ...). Defaults to `None`: the analytical breakdown.
        method: with `device`: `"compile"` (XLA's numbers; an error when the model cannot be compiled on
            JAX), `"analytical"` (kfast's estimate for that GPU's memory), or `None`: compile, else the analytical
            estimate labelled with the reason. Needs `pip install 'kfast[plan-gpu]'` to compile.

    Returns:
        Without `device`, a `MemoryBreakdown`: print it, or read `peak` and its parts. With it, a
        `kfast.planning.DeviceMemory`: print it, or read `peak`, `margin`, `fits` and `changes`.

    Raises:
        ValueError: for a model without a batch dimension, a batch without a common first dimension, an
            unknown precision, or an unknown GPU name (the message lists the known ones).
        kfast.planning.GpuCompileUnavailable: with `device` and a compile asked for, when this Python lacks the
            packages (the message names the install).

    Example:

    >>> model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
    ...                           keras.layers.Dense(10)])
    >>> model.compile("adam", "mse")
    >>> m = estimate_memory(model, batch_size=64)
    >>> m.parameters, m.gradients, m.optimizer, m.activations, m.batch
    (1093672, 1093672, 2187344, 786432, 68096)
    >>> m.peak == m.parameters + m.gradients + m.optimizer + m.activations + m.batch
    True
    """
    if batch_size is None:
        batch_size = 32 if batch is None else batch_rows(batch)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"estimate_memory got batch_size={batch_size!r}; it must be a positive int.")
    if device is not None:
        if len(mesh) != 2 or not all(isinstance(n, int) and n >= 1 for n in mesh):
            raise ValueError(f"estimate_memory got mesh={mesh!r}; expected (data, model) device counts, e.g. (2, 4).")
        variant = StepVariant(batch_size, (mesh[0], mesh[1]), precision, accumulation or 1)
        return plan_device_memory(model, batch if batch is not None else zeros_batch(model), device=device,
                                  variant=variant, method=method)
    if method is not None:
        raise ValueError(f"estimate_memory got method={method!r} without device=; a method is chosen for a named "
                         "GPU (device='H100').")
    memory_model = MemoryModel(model, batch)
    return memory_model.breakdown(batch_size, precision=precision, accumulation=accumulation, mesh=mesh)


def zeros_batch(model: keras.Model) -> Any:
    """A batch of zeros shaped like the model's inputs and (float32) outputs, one row: for compiling only.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> [a.shape for a in zeros_batch(model)]
    [(1, 3), (1, 2)]
    """
    if not getattr(model, "inputs", None):
        raise ValueError(f"kfast got model {model.name!r} without keras.Input and no batch; pass batch= (one batch "
                         "as fit gets it).")
    xs = [np.zeros((1,) + tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype)) for t in model.inputs]
    y = np.zeros((1,) + tuple(model.outputs[0].shape[1:]), "float32")
    return (xs[0] if len(xs) == 1 else xs), y
