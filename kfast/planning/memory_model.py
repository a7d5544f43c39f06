"""The per-device memory of one training step: `MemoryBreakdown`, and `MemoryModel` that predicts it
(`kfast.planning.estimate_memory` is the front door).

Model states (parameters, gradients, optimizer state) come from the model's variables and the optimizer's
own slots; activations from the model's layers (`kfast.planning.activations`); the batch from the data's
shapes. Data parallel holds the same on every device. A `(data, model)` mesh splits the kernels that
`kfast.planning.layouts` splits (their gradients and slots with them) and the batch over the data axis.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kfast import nvml
from kfast._core import fit_timing
from kfast.planning import activations
from kfast.planning import backward_pass
from kfast.planning import layouts
from kfast.planning.cost_model import human_bytes

# Slots per trainable value, by optimizer class, when the optimizer cannot be asked (see `_slot_ratio`).
_SLOTS = {"Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "Lamb": 2, "Adadelta": 2, "Ftrl": 2, "Lion": 1,
          "Adagrad": 1, "Adafactor": 0}
TARGETS = ("cpu", "gpu")
_TRACE_BATCHES = (2, 4)  # activations are linear in the batch: two traces give the line


@dataclass(frozen=True)
class MemoryBreakdown:
    """What one device holds at the peak of a training step, in bytes, as kfast predicts it.

    `peak` is the sum of the five parts. Model states do not depend on the batch; activations and the
    batch grow with it (`per_sample` bytes for each sample of the micro-batch).

    Attributes:
        batch_size: samples per optimizer step on one data-parallel replica (per device under data parallel).
        micro_batch: samples per backward pass: `batch_size` over `accumulation`, rounded up.
        accumulation: backward passes per optimizer step (gradient accumulation).
        precision: the Keras dtype policy predicted for (`"float32"`, `"mixed_float16"`, ...).
        mesh: `(data, model)` devices; `(1, 1)` for data parallel.
        parameters: the model's variables (float32 master weights under mixed precision).
        gradients: one per trainable value, in the variables' dtype.
        optimizer: the optimizer's slots (Adam's two moments, ...), and gradient accumulators.
        activations: the forward tensors the backward pass keeps, and the gradients in flight, at their peak.
        batch: the micro-batch's inputs, targets and sample weights.
        per_sample: activation and batch bytes per sample of the micro-batch.
        peak_at: the layer whose backward pass holds the most activation memory.
        target: the compiler predicted for: `"cpu"` or `"gpu"` (see `MemoryModel.breakdown`).

    Example:

    >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu")])
    >>> model.compile("sgd", "mse")
    >>> m = MemoryModel(model).breakdown(16)
    >>> m.model_states, m.peak == m.model_states + m.activations + m.batch  # SGD: no optimizer state
    (16640, True)
    """

    batch_size: int
    micro_batch: int
    accumulation: int
    precision: str
    mesh: tuple[int, int]
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    batch: int
    per_sample: float
    peak_at: str
    target: str = "cpu"

    @property
    def model_states(self) -> int:
        """Parameters, gradients and optimizer state: what does not depend on the batch."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def peak(self) -> int:
        """The sum of the parts: the most the step holds at once."""
        return self.model_states + self.activations + self.batch

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mesh": list(self.mesh), "model_states": self.model_states, "peak": self.peak}

    def __str__(self) -> str:
        how = "data parallel" if self.mesh == (1, 1) else f"mesh (data, model) = {self.mesh}"
        if self.accumulation > 1:
            how += f", {self.accumulation} passes of {self.micro_batch}"
        rows = [("parameters", self.parameters), ("gradients", self.gradients), ("optimizer state", self.optimizer),
                ("activations", self.activations), ("input batch", self.batch), ("peak", self.peak)]
        lines = [f"memory per device at batch {self.batch_size} ({self.precision}, {how}):"]
        lines += [f"  {name:<16}{human_bytes(n):>10}" for name, n in rows]
        lines[-3] += f"  (kept for the backward pass; most at {self.peak_at})"
        return "\n".join(lines)


def _this_machine() -> str:
    """The compiler a step here gets: a GPU's when NVML sees one, else the CPU's."""
    try:
        return "gpu" if nvml.list_gpus() else "cpu"
    except nvml.NvmlUnavailable:
        return "cpu"


def _itemsize(dtype: Any) -> int:
    return int(np.dtype(keras.backend.standardize_dtype(dtype)).itemsize)


def check_precision(precision: str) -> keras.DTypePolicy:
    """The Keras dtype policy named `precision`.

    Raises:
        ValueError: for a name that is not a Keras dtype policy.

    Example:

    >>> check_precision("mixed_bfloat16").compute_dtype
    'bfloat16'
    """
    try:
        return keras.DTypePolicy(precision)
    except (ValueError, TypeError) as e:
        raise ValueError(f"precision={precision!r} is not a Keras dtype policy; expected 'float32', "
                         "'mixed_float16' or 'mixed_bfloat16' (or None: the model's own).") from e


def _policy(precision: str | None, model: keras.Model) -> keras.DTypePolicy:
    return check_precision(precision or model.dtype_policy.name)


def _slot_ratio(optimizer: Any, trainable_bytes: int) -> float:
    """Bytes of optimizer state per byte of trainable values, from the optimizer itself (built: its variables;
    not built: a throwaway copy of its config built on a small stand-in variable), else from its class."""
    def slot_bytes(variables: list[Any]) -> int:
        return sum(math.prod(v.shape) * _itemsize(v.dtype) for v in variables if len(v.shape) >= 1)

    if optimizer.built:
        return slot_bytes(optimizer.variables) / trainable_bytes if trainable_bytes else 0.0
    try:
        copy = type(optimizer).from_config(optimizer.get_config())
        stand_in = keras.Variable(np.zeros((8, 8), "float32"), name="kfast_stand_in")
        copy.build([stand_in])
        ratio = slot_bytes(copy.variables) / (64 * 4)
        del copy, stand_in
        return ratio
    except Exception:  # a custom optimizer whose config does not rebuild it: count by its class
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        name = type(inner).__name__
        if name == "SGD":
            return float(getattr(inner, "momentum", 0) > 0)
        if name == "RMSprop":
            return 1.0 + (getattr(inner, "momentum", 0) > 0) + bool(getattr(inner, "centered", False))
        return float(_SLOTS.get(name, 2))


def _accumulates(optimizer: Any) -> int:
    return int(getattr(optimizer, "backward_passes_per_step", None) or
               getattr(optimizer, "gradient_accumulation_steps", None) or 1)


class MemoryModel:
    """A model's memory, traced once and predicted for any batch, precision, accumulation and mesh.

    Args:
        model: a built, compiled Keras model.
        batch: one batch as `fit` gets it (inputs, or `(x, y)` / `(x, y, sample_weight)`), read for its
            shapes and dtypes only. Defaults to `None`: the model's `keras.Input`s, targets shaped like
            its output.

    Raises:
        ValueError: for a model without a batch dimension, or whose inputs cannot be read.

    Example:

    >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu")])
    >>> model.compile("adam", "mse")
    >>> memory = MemoryModel(model)  # traced once
    >>> [memory.breakdown(n).activations for n in (16, 32)], memory.breakdown(16, accumulation=2).micro_batch
    ([6144, 12288], 8)
    """

    def __init__(self, model: keras.Model, batch: Any = None) -> None:
        self.model = model
        if batch is not None:
            fit_timing.build_from_batch(model, batch, "kfast's memory estimate")
        elif not model.built:
            raise ValueError(f"kfast got model {model.name!r}, which is not built and no batch; pass batch= (one "
                             "batch as fit gets it), or build the model (keras.Input, or call it once).")
        x_spec, self.batch_per_sample = _input_specs(model, batch)
        self.trainable = [(v.path, tuple(int(d) for d in v.shape), _itemsize(v.dtype))
                          for v in model.trainable_variables]
        self.frozen_bytes = sum(math.prod(v.shape) * _itemsize(v.dtype) for v in model.non_trainable_variables)
        trainable_bytes = sum(math.prod(s) * n for _, s, n in self.trainable)
        optimizer = getattr(model, "optimizer", None)
        self.slots = _slot_ratio(optimizer, trainable_bytes) if optimizer is not None else 0.0
        self.accumulating = _accumulates(optimizer) if optimizer is not None else 1
        self.optimizer_name = type(getattr(optimizer, "inner_optimizer", optimizer)).__name__
        self.target = _this_machine()  # the compiler a breakdown predicts for unless told: asked once
        self._steps = []
        self._lines: dict[tuple[int, str], list[tuple[str, float, float, int]]] = {}
        self._split: dict[int, set[str]] = {}
        for n in _TRACE_BATCHES:
            spec = keras.tree.map_structure(lambda s: keras.KerasTensor((n,) + s.shape[1:], s.dtype), x_spec)
            try:
                calls, seen = activations.trace(model, spec)
            except Exception as e:
                raise ValueError(f"kfast could not trace model {model.name!r} on inputs shaped "
                                 f"{[tuple(s.shape) for s in keras.tree.flatten(spec)]} to read its activations: "
                                 f"{type(e).__name__}: {e} Pass the batch you train on (batch=), or check that the "
                                 "model's call() accepts it.") from e
            self._steps.append(activations.steps(calls, seen, activations.loss_keeps(model)))
        unread = sorted({f"{type(c.layer).__name__} {c.layer.name!r}" for c in calls if c.unread})
        if unread:
            # Said, never silently low: what a layer keeps inside is read from Keras's graph of its call.
            warnings.warn(f"kfast's memory estimate counts {', '.join(unread)} as one layer each: their call() does "
                          "not run on KerasTensors (a loop over time steps, a backend function), so what they keep "
                          "inside for the backward pass is not in the estimate, which is low by that much. For XLA's "
                          "own number, plan with device= (a GPU by name, on any backend), or compiled=True on Keras's "
                          "JAX backend.", stacklevel=3)

    def _activation_lines(self, float_bytes: int, target: str) -> list[tuple[str, float, float, int]]:
        """Each step's (name, activation bytes at batch 0, bytes per sample, weight-gradient bytes) for floating
        values of `float_bytes`: what a step holds is linear in the batch, but which step holds the most may
        change with it (a recurrent layer's backward against the loss's), so the peak is taken per batch."""
        if (float_bytes, target) not in self._lines:
            small, large = (backward_pass.step_bytes(s, float_bytes, target=target)
                            for s in self._steps)
            span = _TRACE_BATCHES[1] - _TRACE_BATCHES[0]
            self._lines[float_bytes, target] = [
                (name, a - (b - a) / span * _TRACE_BATCHES[0], (b - a) / span, grads)
                for (name, a, grads), (_, b, _) in zip(small, large)]
        return self._lines[float_bytes, target]

    def _activations_at(self, micro: int, float_bytes: int, target: str) -> tuple[float, float, str]:
        """(activation bytes, bytes per sample, step) at the peak of a micro-batch of `micro` samples."""
        lines = self._activation_lines(float_bytes, target)
        name, constant, slope, _ = max(lines, key=lambda line: line[1] + line[2] * micro)
        return constant + slope * micro, slope, name

    def breakdown(self, batch_size: int, *, precision: str | None = None, accumulation: int | None = None,
                  mesh: tuple[int, int] = (1, 1), target: str | None = None) -> MemoryBreakdown:
        """The per-device breakdown at `batch_size` samples per step per data-parallel replica, under
        `precision` (None: the model's policy), `accumulation` passes (None: the optimizer's own) and a
        `(data, model)` mesh, for a `target` compiler: `"cpu"` (XLA's CPU backend re-lays some tensors out in
        copies of their own) or `"gpu"` (None: `self.target`, a GPU when NVML saw one here, else the CPU)."""
        target = target or self.target
        if target not in TARGETS:
            raise ValueError(f"kfast got target={target!r}; expected one of {TARGETS}.")
        policy = _policy(precision, self.model)
        k = accumulation or self.accumulating
        micro = math.ceil(batch_size / k)
        variable_bytes = _itemsize(policy.variable_dtype)
        if len(mesh) != 2 or not all(isinstance(n, int) and n >= 1 for n in mesh):
            raise ValueError(f"kfast got mesh={mesh!r}; expected (data, model) device counts, e.g. (2, 4).")
        if mesh[1] not in self._split:
            self._split[mesh[1]] = layouts.split_paths(self.model, mesh[1]) if mesh[1] > 1 else set()
        split = self._split[mesh[1]]
        values = sum(math.prod(s) / (mesh[1] if path in split else 1) for path, s, _ in self.trainable)
        trainable = int(values * variable_bytes)
        active, slope, where = self._activations_at(micro, _itemsize(policy.compute_dtype), target)
        accumulators = trainable if k > 1 and self.accumulating == 1 else 0
        return MemoryBreakdown(
            batch_size=batch_size, micro_batch=micro, accumulation=k, precision=policy.name, mesh=(mesh[0], mesh[1]),
            parameters=trainable + self.frozen_bytes, gradients=trainable,
            optimizer=int(self.slots * trainable) + accumulators,
            activations=int(round(active)), batch=int(self.batch_per_sample * micro),
            per_sample=slope + self.batch_per_sample, peak_at=where, target=target)


def _leaves(batch: Any) -> list[Any]:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    return [np.asarray(a) if not hasattr(a, "shape") else a for a in keras.tree.flatten((x, y, sample_weight))
            if a is not None]


def batch_rows(batch: Any) -> int:
    """The number of samples in `batch` (one batch as `fit` gets it).

    Raises:
        ValueError: for a batch whose arrays share no first dimension.

    Example:

    >>> batch_rows((np.zeros((8, 3)), np.zeros(8)))
    8
    """
    leaves = _leaves(batch)
    sizes = {int(a.shape[0]) for a in leaves if len(a.shape)}
    if any(not len(a.shape) for a in leaves) or len(sizes) != 1:
        raise ValueError(f"kfast got a batch of shapes {[tuple(a.shape) for a in leaves]}, which has no common "
                         "batch dimension; pass one batch as fit gets it: arrays whose first dimension is the "
                         "batch, e.g. (x of shape (32, 784), y of shape (32,)).")
    return sizes.pop()


def _input_specs(model: keras.Model, batch: Any) -> tuple[Any, float]:
    """KerasTensors for the model's inputs (batch dimension None) and the data's bytes per sample."""
    if batch is None:
        if not getattr(model, "inputs", None):
            raise ValueError(f"kfast got model {model.name!r} without keras.Input and no batch; pass batch= (one "
                             "batch as fit gets it), or build the model with keras.Input.")
        for t in model.inputs:
            if t.shape[0] is not None:
                raise ValueError(f"kfast got model {model.name!r} whose input {t.name!r} has a fixed batch: shape "
                                 f"{tuple(t.shape)}, so its memory cannot follow the batch size; build it with "
                                 f"keras.Input(shape={tuple(t.shape[1:])}) (no batch dimension in shape=).")
        x = model.inputs[0] if len(model.inputs) == 1 else list(model.inputs)
        specs = keras.tree.map_structure(lambda t: keras.KerasTensor((None,) + tuple(t.shape[1:]), t.dtype), x)
        per_sample = sum(math.prod(d or 1 for d in t.shape[1:]) * _itemsize(t.dtype) for t in model.inputs)
        per_sample += sum(math.prod(d or 1 for d in t.shape[1:]) * 4 for t in model.outputs)  # targets
        return specs, float(per_sample)
    x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
    n = batch_rows(batch)
    leaves = _leaves(batch)
    per_sample = sum(math.prod(a.shape) * _itemsize(a.dtype) for a in leaves) / n
    specs = keras.tree.map_structure(
        lambda a: keras.KerasTensor((None,) + tuple(np.shape(a))[1:], keras.backend.standardize_dtype(a.dtype)), x)
    return specs, per_sample
