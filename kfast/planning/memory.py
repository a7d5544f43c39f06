"""Will it fit? `plan_memory`: the predicted breakdown of a device's memory, the verdict against the device,
and, under Keras on JAX, XLA's own analysis of the compiled step beside them; what `kfast.plan` reports as
`Plan.memory`.

The device's memory is given (`device_memory="80GB"`) or read through NVML from the first GPU; without
either, the breakdown stands alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras

from kfast import nvml
from kfast.planning import memory_fit
from kfast.planning.device_memory import DeviceMemory
from kfast.planning.device_memory import plan_device_memory
from kfast.planning.estimate import zeros_batch
from kfast.planning.memory_fit import MemoryFit
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.memory_model import MemoryModel
from kfast.planning.step_variants import StepVariant
from kfast.planning.xla_memory import CompiledStepMemory
from kfast.planning.xla_memory import compiled_step_memory


@dataclass(frozen=True)
class MemoryReport:
    """kfast's memory prediction for one device, with the verdict and XLA's own numbers where it has them.

    Attributes:
        breakdown: the predicted `MemoryBreakdown` of the step as it is.
        fit: the `MemoryFit` against the device, or `None` when the device's memory is unknown.
        compiled: XLA's `CompiledStepMemory` of the same step (Keras on JAX), else `None`.
        gpu: the step compiled for a named GPU (`DeviceMemory`: XLA's numbers, the margin, the verdict and the
            compiled changes), when one was named, else `None`.

    Example:

    >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu")])
    >>> model.compile("adam", "mse")
    >>> report = plan_memory(model, batch_size=16, device_memory="1GB", compiled=False)
    >>> report.fit.fits, report.compiled, sorted(report.to_dict())
    (True, None, ['breakdown', 'compiled', 'fit', 'gpu'])
    """

    breakdown: MemoryBreakdown
    fit: MemoryFit | None
    compiled: CompiledStepMemory | None
    gpu: DeviceMemory | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"breakdown": self.breakdown.to_dict(), "fit": self.fit.to_dict() if self.fit else None,
                "compiled": self.compiled.to_dict() if self.compiled else None,
                "gpu": self.gpu.to_dict() if self.gpu else None}

    def __str__(self) -> str:
        lines = str(self.breakdown).splitlines()
        if self.compiled:
            error = self.breakdown.peak / self.compiled.total - 1
            lines.append(f"  {self.compiled} (kfast's prediction {error:+.0%})")
        if self.fit:
            lines += self.fit.lines(self.breakdown.peak)
        elif not self.gpu:
            lines.append("fit: no GPU visible to NVML and no device memory given; pass device_memory= (kfast plan "
                         "--device-memory 80GB) for the verdict.")
        if self.gpu:
            lines += ["", str(self.gpu)]
        return "\n".join(lines)


def _gpu_memory() -> tuple[int, str] | None:
    """(bytes, description) of the first GPU NVML sees, or None."""
    try:
        gpus = nvml.list_gpus()
    except nvml.NvmlUnavailable:
        return None
    if not gpus:
        return None
    return int(gpus[0]["memory_total_mib"]) * 2**20, f"GPU 0, {gpus[0]['name']}, through NVML"


def plan_memory(model: keras.Model, batch: Any = None, *, batch_size: int | None = None, precision: str | None = None,
                accumulation: int | None = None, device_memory: str | float | None = None,
                compiled: bool | None = None, device: str | None = None,
                method: str | None = None) -> MemoryReport:
    """Predicts one device's memory for a training step of `model`, says whether it fits, and what to change.

    Args:
        model: a compiled Keras model.
        batch: one batch as `fit` gets it, for its shapes. Defaults to `None`: the model's `keras.Input`s.
        batch_size: samples per optimizer step per device. Defaults to `None`: the batch's size, or 32.
        precision: `"float32"`, `"mixed_float16"` or `"mixed_bfloat16"`. Defaults to `None`: the model's.
        accumulation: backward passes per optimizer step. Defaults to `None`: the optimizer's own.
        device_memory: the device's memory: bytes, or a string such as `"80GB"` or `"16GiB"`. Defaults to
            `None`: the first GPU's, through NVML; without one, no verdict.
        compiled: also compile the step and read XLA's analysis. Defaults to `None`: on JAX only.
        device: also compile the step for this GPU by name (`"H100"`; see `kfast.planning.estimate_memory`):
            the report's `gpu`. Defaults to `None`.
        method: how to plan for `device`: `"compile"`, `"analytical"`, or `None` (compile where it works).

    Returns:
        A `MemoryReport`.

    Raises:
        ValueError: for a memory string it cannot read, or a model without a batch dimension.

    Example:

    >>> model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu"),
    ...                           keras.layers.Dense(10)])
    >>> model.compile("adam", "mse")
    >>> report = plan_memory(model, batch_size=8192, device_memory="512MB", compiled=False)
    >>> report.fit.fits, report.fit.largest_batch, report.fit.change.precision
    (False, 7374, 'mixed_bfloat16')
    >>> change = plan_memory(model, batch_size=8192, device_memory="256MB", compiled=False).fit.change
    >>> change.precision, change.accumulation, change.breakdown.micro_batch
    ('float32', 4, 2048)
    """
    given = device_memory is not None
    memory = memory_fit.parse_memory(device_memory) if device_memory is not None else None
    memory_model = MemoryModel(model, batch)
    if batch_size is None:
        batch_size = 32 if batch is None else int(keras.ops.shape(keras.tree.flatten(batch)[0])[0])
    now = memory_model.breakdown(batch_size, precision=precision, accumulation=accumulation)
    gpus_here = None if given or device is not None else _gpu_memory()
    fit = None
    if memory is not None:
        fit = memory_fit.check_fit(memory_model, now, memory)
    elif gpus_here is not None:
        fit = memory_fit.check_fit(memory_model, now, gpus_here[0], gpus_here[1])
    step = None
    if compiled or compiled is None and keras.backend.backend() == "jax":
        try:
            step = compiled_step_memory(model, batch if batch is not None else zeros_batch(model), batch_size=now.micro_batch)
        except Exception:
            if compiled:
                raise
            # Asked for by default, XLA's numbers are a second opinion: a step XLA cannot compile on its own (one
            # that calls out to Horovod, say) leaves kfast's prediction standing alone.
    gpu_plan = None
    if device is not None:
        gpu_plan = plan_device_memory(model, batch if batch is not None else zeros_batch(model), device=device,
                                      variant=StepVariant(batch_size, (1, 1), precision, now.accumulation),
                                      method=method)
    return MemoryReport(now, fit, step, gpu_plan)
