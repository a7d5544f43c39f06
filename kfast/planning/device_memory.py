"""Will it fit on the GPU you are about to rent: `plan_device_memory` and the `DeviceMemory` it returns.

The step is compiled for the named GPU (kfast.planning.gpu_compile): XLA's own buffer assignment, per device of
the mesh. The GPU's memory is not all the step's: the runtime keeps a margin (`RuntimeMargin`, stated with its
source per backend), taken from the GPU's memory, never added to the peak. When the step does not fit, each change
that could make it fit is compiled for the same GPU and ranked by its peak. A model that cannot be compiled on JAX
(a layer calling TensorFlow ops, a config Keras cannot rebuild) gets kfast's analytical estimate, labelled, with
the error range measured on benchmarks/memory_zoo.py beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import keras

from kfast.planning import gpu_compile
from kfast.planning import gpus
from kfast.planning.cost_model import human_bytes
from kfast.planning.deviceless import GpuCompileUnavailable
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.memory_model import MemoryModel
from kfast.planning.step_variants import NoRecipe
from kfast.planning.step_variants import StepVariant
from kfast.planning.xla_memory import CompiledStepMemory

METHODS = ("compile", "analytical")
# The analytical estimate against XLA's compile for an H100, over benchmarks/memory_zoo.py's models and batches
# (estimate / XLA): the range printed beside an analytical number. Updated with RESULTS.md.
ANALYTICAL_RANGE = (0.76, 1.40)
_CONTEXT = 512 * 2**20  # the CUDA context and libraries' allowance outside JAX's pool: not measured here


@dataclass(frozen=True)
class RuntimeMargin:
    """What of the GPU's memory the training step cannot have, and why (the source named).

    Example:

    >>> m = runtime_margin(gpus.gpu_spec("H100"), "jax")
    >>> round(m.reserved / gpus.gpu_spec("H100").memory, 2), "pools 75%" in m.why
    (0.25, True)
    """

    reserved: int
    why: str


def runtime_margin(spec: gpus.GpuSpec, backend: str) -> RuntimeMargin:
    """The margin the runtime of `backend` keeps on `spec`'s memory.

    Sources: JAX preallocates 75% of the GPU's memory for its arrays unless XLA_PYTHON_CLIENT_MEM_FRACTION (or
    XLA_CLIENT_MEM_FRACTION) says otherwise (JAX's "GPU memory allocation" page); the CUDA context and the
    cuBLAS/cuDNN handles live outside that pool, and XLA's own gemm and convolution workspaces are in the
    compiled step's working memory already. TensorFlow's GPU allocator leaves max(300 MiB, 6%) of the free memory
    to the system (`MinSystemMemory` in TensorFlow's `gpu_device.cc`). The CUDA context's own size depends on the
    driver and the kernels loaded: 512 MiB is an allowance, not measured here (benchmarks/gpu_memory_check.py
    measures it where a GPU is lent).
    """
    if backend == "jax":
        text = os.environ.get("XLA_CLIENT_MEM_FRACTION") or os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
        fraction = float(text) if text else 0.75
        return RuntimeMargin(int(spec.memory * (1 - fraction)),
                             f"JAX pools {fraction:.0%} of the GPU for arrays (XLA_PYTHON_CLIENT_MEM_FRACTION); the "
                             "CUDA context and libraries use the rest")
    if backend == "tensorflow":
        free = spec.memory - _CONTEXT
        system = max(300 * 2**20, int(free * 0.06))
        return RuntimeMargin(_CONTEXT + system,
                             "the CUDA context and libraries (512 MiB allowed), and what TensorFlow's allocator "
                             "leaves the system: max(300 MiB, 6% of the rest)")
    return RuntimeMargin(_CONTEXT, "the CUDA context and libraries (512 MiB allowed); PyTorch's cache "
                                   "fragmentation is not counted")


@dataclass(frozen=True)
class CompiledChange:
    """One change to the step, compiled for the same GPU: its `label`, its `peak` per device, whether it `fits`."""

    label: str
    peak: int
    fits: bool
    variant: StepVariant

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "peak": self.peak, "fits": self.fits, "variant": self.variant.to_dict()}


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory for a training step on a named GPU, the margin, the verdict and the changes.

    Attributes:
        device: the GPU (`kfast.planning.gpus.GpuSpec`).
        variant: the step planned: batch per replica, mesh, precision, accumulation.
        method: `"compile"` (XLA's numbers for that GPU) or `"analytical"` (kfast's estimate).
        peak: bytes per device at the step's peak: XLA's arguments + working memory + outputs not written over
            donated arguments, or the analytical estimate's peak.
        margin: the `RuntimeMargin` kept from the GPU's memory.
        compiled: XLA's `CompiledStepMemory` (method "compile"), else `None`.
        breakdown: the analytical `MemoryBreakdown` (method "analytical"), else `None`.
        reason: why the analytical estimate stands in for a compile, or `None`.
        changes: when it does not fit, each change compiled for the same GPU, smallest peak first.
    """

    device: gpus.GpuSpec
    variant: StepVariant
    method: str
    peak: int
    margin: RuntimeMargin
    compiled: CompiledStepMemory | None = None
    breakdown: MemoryBreakdown | None = None
    reason: str | None = None
    changes: tuple[CompiledChange, ...] = field(default_factory=tuple)

    @property
    def usable(self) -> int:
        """The GPU's memory less the runtime's margin: what the step may hold."""
        return self.device.memory - self.margin.reserved

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device.name, "description": self.device.description, "memory": self.device.memory,
                "variant": self.variant.to_dict(), "method": self.method, "peak": self.peak,
                "margin": {"reserved": self.margin.reserved, "why": self.margin.why}, "usable": self.usable,
                "fits": self.fits, "compiled": self.compiled.to_dict() if self.compiled else None,
                "breakdown": self.breakdown.to_dict() if self.breakdown else None, "reason": self.reason,
                "changes": [c.to_dict() for c in self.changes]}

    def __str__(self) -> str:
        v, spec = self.variant, self.device
        where = spec.name if v.mesh == (1, 1) else f"{spec.name}, per device of a (data, model) = {v.mesh} mesh"
        lines = [f"memory on {where} ({spec.description}, {human_bytes(spec.memory)}), batch {v.batch_size}"
                 f"{', ' + v.label() if v.label() != 'as it is' else ''}:"]
        if self.compiled:
            c = self.compiled
            lines += [f"  arguments       {human_bytes(c.argument):>10}  (weights, optimizer and metric state, batch)",
                      f"  working memory  {human_bytes(c.temp):>10}  (gradients, activations, XLA's temporaries)",
                      f"  outputs         {human_bytes(c.output - c.alias):>10}  (not written over donated state)",
                      f"  peak            {human_bytes(self.peak):>10}  (XLA's buffer assignment for {spec.name})"]
        else:
            low, high = ANALYTICAL_RANGE
            lines += [f"  peak            {human_bytes(self.peak):>10}  (kfast's analytical estimate: "
                      f"{low:.2f}-{high:.2f}x XLA's number on kfast's model zoo)"]
            if self.reason:
                lines.append(f"  not compiled: {self.reason}")
        lines.append(f"  runtime margin  {human_bytes(self.margin.reserved):>10}  ({self.margin.why})")
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(f"  {verdict}: {human_bytes(self.peak)} of {human_bytes(self.usable)} usable")
        if self.reason and self.compiled:
            lines.append(f"  {self.reason}")
        if self.changes:
            lines.append(f"changes compiled for {spec.name} (peak per device, smallest first):")
            lines += [f"  {'fits' if c.fits else 'no  '}  {human_bytes(c.peak):>10}  {c.label}" for c in self.changes]
            lines.append("  (optimizer state sharded apart from its weights: neither kfast engine does it, so not "
                         "offered)")
        return "\n".join(lines)


def candidate_changes(spec: gpus.GpuSpec, variant: StepVariant) -> list[StepVariant]:
    """The changes worth compiling when `variant` does not fit `spec`: mixed precision (bfloat16 from compute
    capability 8, float16 before), gradient accumulation of 2, 4 and 8 micro-batches, full rematerialisation,
    and a model axis of 2 and 4 devices.

    Example:

    >>> [v.label() for v in candidate_changes(gpus.gpu_spec("V100"), StepVariant(4))][:3]
    ['mixed_float16', 'batch 2 x 2 accumulated', 'batch 1 x 4 accumulated']
    """
    out = []
    if variant.precision in (None, "float32"):
        mixed = "mixed_bfloat16" if spec.compute_capability >= (8, 0) else "mixed_float16"
        out.append(StepVariant(variant.batch_size, variant.mesh, mixed, variant.accumulation, variant.remat))
    for k in (2, 4, 8):
        if variant.accumulation == 1 and variant.batch_size >= k:
            out.append(StepVariant(variant.batch_size, variant.mesh, variant.precision, k, variant.remat))
    if variant.remat is None:
        out.append(StepVariant(variant.batch_size, variant.mesh, variant.precision, variant.accumulation, "full"))
    if variant.mesh[1] == 1:
        out += [StepVariant(variant.batch_size, (variant.mesh[0], n), variant.precision, variant.accumulation,
                            variant.remat) for n in (2, 4)]
    return out


def plan_device_memory(model: keras.Model, batch: Any, *, device: str, variant: StepVariant,
                       method: str | None = None, changes: bool = True) -> DeviceMemory:
    """One device's memory for `model`'s step as `variant` runs it on the GPU named `device`.

    Args:
        model: a compiled Keras model.
        batch: one batch as `fit` gets it, for its shapes and dtypes.
        device: a GPU name (`kfast.planning.gpus.known_gpus()`).
        variant: the batch per replica, mesh, precision and accumulation to plan.
        method: `"compile"`, `"analytical"`, or `None`: compile, and the analytical estimate (labelled, with the
            reason) for a model that cannot be compiled on JAX.
        changes: when it does not fit, compile the candidate changes too.

    Raises:
        ValueError: for an unknown GPU or method.
        GpuCompileUnavailable: when compiling for a GPU needs packages this Python lacks (the fix named), with
            method `"compile"` or `None`.
    """
    spec = gpus.gpu_spec(device)
    if method not in (None, *METHODS):
        raise ValueError(f"method={method!r}; expected 'compile', 'analytical' or None (compile where it works).")
    margin = runtime_margin(spec, keras.backend.backend())
    reason = None
    if method != "analytical":
        try:
            step = gpu_compile.compile_step(model, batch, variant, spec.name)
        except GpuCompileUnavailable:
            raise
        except (NoRecipe, RuntimeError, ValueError, TypeError, NotImplementedError) as e:
            if method == "compile":
                raise
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            plan = DeviceMemory(spec, variant, "compile", step.total, margin, compiled=step)
            return _with_changes(plan, model, batch) if changes and not plan.fits else plan
    breakdown = MemoryModel(model, batch).breakdown(variant.batch_size, precision=variant.precision,
                                                    accumulation=variant.accumulation, mesh=variant.mesh,
                                                    target="gpu")
    return DeviceMemory(spec, variant, "analytical", breakdown.peak, margin, breakdown=breakdown, reason=reason)


def _with_changes(plan: DeviceMemory, model: keras.Model, batch: Any) -> DeviceMemory:
    candidates = candidate_changes(plan.device, plan.variant)
    try:
        results = gpu_compile.compile_variants(model, batch, candidates, plan.device.name)
    except (NoRecipe, RuntimeError) as e:
        return DeviceMemory(plan.device, plan.variant, plan.method, plan.peak, plan.margin, plan.compiled,
                            reason=f"changes not compiled: {e}")
    compiled = [CompiledChange(v.label(), r.total, r.total <= plan.usable, v)
                for v, r in zip(candidates, results) if isinstance(r, CompiledStepMemory)]
    compiled.sort(key=lambda c: c.peak)
    return DeviceMemory(plan.device, plan.variant, plan.method, plan.peak, plan.margin, plan.compiled,
                        changes=tuple(compiled))
