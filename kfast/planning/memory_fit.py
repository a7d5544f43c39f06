"""Will it fit? A device's memory against the predicted step: the verdict, the largest batch, the cheapest change.

The changes are tried in the order of what they cost the user: mixed precision (a policy, no new devices, and
faster on GPUs with tensor cores), gradient accumulation (the same global batch in more, smaller passes: the
same result, slower steps), then model parallel (kernels split over more devices: new hardware and a JAX
`ModelParallel` layout); each alone first, then combined. kfast counts a device as full at
`USABLE_SHARE` of its memory: the CUDA context, kernels' workspaces and the allocator's fragmentation take the
rest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kfast.planning.cost_model import human_bytes
from kfast.planning.memory_model import MemoryBreakdown
from kfast.planning.memory_model import MemoryModel

USABLE_SHARE = 0.9
_MOST_MODEL_AXIS = 64
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_HALF = {"float32": "mixed_bfloat16", "mixed_float16": None, "mixed_bfloat16": None}


def parse_memory(text: str | float) -> int:
    """Bytes from `"80GB"`, `"16GiB"`, `"512MB"`, `"40 GB"` or a number of bytes (GB is 10^9, GiB 2^30).

    Example:

    >>> parse_memory("80GB"), parse_memory("16GiB"), parse_memory(512e6)
    (80000000000, 17179869184, 512000000)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([kmgt]?i?b)\s*", str(text), re.IGNORECASE)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        try:
            value = float(match.group(1)) * unit if match and unit else math.nan
        except ValueError:
            value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"device_memory={text!r} is not an amount of memory; expected bytes (a number) or a number "
                         "and a unit such as 80GB, 16GiB or 512MB.")
    return int(value)


@dataclass(frozen=True)
class Change:
    """A change that makes the step fit, and the prediction with it applied.

    Attributes:
        what: the change in words, with how to make it.
        precision: the dtype policy with the change.
        accumulation: backward passes per optimizer step.
        mesh: `(data, model)` devices per data-parallel replica (`(1, 1)`: data parallel).
        breakdown: the predicted memory with the change.

    Example:

    >>> model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu")])
    >>> model.compile("sgd", "mse")
    >>> change = kfast.planning.plan_memory(model, batch_size=8192, device_memory="256MB", compiled=False).fit.change
    >>> change.precision, change.accumulation, change.breakdown.peak <= 0.9 * 256e6
    ('float32', 4, True)
    """

    what: str
    precision: str
    accumulation: int
    mesh: tuple[int, int]
    breakdown: MemoryBreakdown

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "precision": self.precision, "accumulation": self.accumulation,
                "mesh": list(self.mesh), "peak": self.breakdown.peak}


@dataclass(frozen=True)
class MemoryFit:
    """Whether the step fits a device, and what to change when it does not.

    Attributes:
        device_memory: the device's bytes; `usable` the share kfast fills (`USABLE_SHARE`).
        source: where `device_memory` came from ("given", or the GPU NVML names).
        fits: whether the predicted peak is within `usable`.
        largest_batch: the largest micro-batch per device (what `fit` gets per step) that fits as it is;
            0 when the model states alone do not.
        change: the cheapest change that fits (None when it fits, or when none found does).

    Example:

    >>> model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu")])
    >>> model.compile("sgd", "mse")
    >>> fit = kfast.planning.plan_memory(model, batch_size=1024, device_memory="16GB", compiled=False).fit
    >>> fit.fits, fit.usable, fit.change
    (True, 14400000000, None)
    """

    device_memory: int
    usable: int
    source: str
    fits: bool
    largest_batch: int
    change: Change | None

    def to_dict(self) -> dict[str, Any]:
        return {"device_memory": self.device_memory, "usable": self.usable, "source": self.source,
                "fits": self.fits, "largest_batch": self.largest_batch,
                "change": self.change.to_dict() if self.change else None}

    def lines(self, peak: int) -> list[str]:
        share = f"{peak / self.device_memory:.0%} of {human_bytes(self.device_memory)} ({self.source})"
        if self.fits:
            return [f"fits: {share}; the largest batch per device that fits is {self.largest_batch}."]
        out = [f"does not fit: {share}; kfast fills {USABLE_SHARE:.0%}."]
        out.append(f"largest batch per device that fits as it is: {self.largest_batch}" +
                   (" (the model states alone do not fit)." if self.largest_batch == 0 else "."))
        if self.change:
            out.append(f"cheapest change: {self.change.what} -> {human_bytes(self.change.breakdown.peak)}.")
        else:
            out.append(f"no change kfast knows fits it: a model axis of {_MOST_MODEL_AXIS} with mixed precision and "
                       "accumulation to batch 1 still does not; a smaller model or a larger device does.")
        return out


def largest_batch(breakdown: MemoryBreakdown, usable: int) -> int:
    """The largest micro-batch for which `breakdown`'s step (its precision, accumulation and mesh) fits
    `usable` bytes; activations and the batch grow linearly with it.

    Example:

    >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu")])
    >>> model.compile("sgd", "mse")
    >>> m = kfast.planning.estimate_memory(model, batch_size=16)
    >>> edge = largest_batch(m, 10**6)
    >>> edge, [kfast.planning.estimate_memory(model, batch_size=n).peak <= 10**6 for n in (edge, edge + 1)]
    (1280, [True, False])
    """
    room = usable - breakdown.model_states - (breakdown.activations + breakdown.batch
                                              - breakdown.per_sample * breakdown.micro_batch)
    return max(0, int(room // breakdown.per_sample)) if breakdown.per_sample > 0 else 0


def _candidates(now: MemoryBreakdown) -> list[tuple[str, bool, bool]]:
    """(precision, accumulate, split) to try, cheapest first: each change alone, then together."""
    half = _HALF.get(now.precision) or now.precision
    order = [(half, False, False), (now.precision, True, False), (half, True, False), (now.precision, False, True),
             (half, False, True), (now.precision, True, True), (half, True, True)]
    return [c for c in order if c[0] != now.precision or c[1] or c[2]]


def _describe(now: MemoryBreakdown, new: MemoryBreakdown) -> str:
    parts = []
    if new.precision != now.precision:
        parts.append(f"mixed precision: keras.mixed_precision.set_global_policy('{new.precision}') before building "
                     "the model ('mixed_float16' on GPUs without bfloat16)")
    if new.accumulation != now.accumulation:
        parts.append(f"gradient accumulation: {new.accumulation} passes of {new.micro_batch} for the same batch of "
                     f"{new.batch_size} (batch_size={new.micro_batch} and keras.optimizers.*("
                     f"gradient_accumulation_steps={new.accumulation}), or kfast.DistributedOptimizer("
                     f"backward_passes_per_step={new.accumulation}))")
    if new.mesh != now.mesh:
        parts.append(f"model parallel: each replica's kernels split over {new.mesh[1]} devices, a (data, model) = "
                     f"(N, {new.mesh[1]}) mesh for N replicas (Keras on JAX: ModelParallel with "
                     f"kfast.planning.propose_layout_map(model, (N, {new.mesh[1]})))")
    return "; and ".join(parts)


def check_fit(memory_model: MemoryModel, now: MemoryBreakdown, device_memory: int, source: str = "given") -> MemoryFit:
    """Whether `now` fits `device_memory`, the largest batch, and the cheapest change that fits.

    Args:
        memory_model: the model's `MemoryModel` (predicts each change).
        now: the step as it is.
        device_memory: the device's bytes.
        source: where the number came from. Defaults to `"given"`.

    Returns:
        A `MemoryFit`.

    Example:

    >>> from kfast.planning.memory_model import MemoryModel
    >>> model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096, activation="relu")])
    >>> model.compile("sgd", "mse")
    >>> memory = MemoryModel(model)
    >>> fit = check_fit(memory, memory.breakdown(8192), 128 * 10**6)
    >>> fit.fits, fit.change.accumulation, fit.change.breakdown.micro_batch
    (False, 16, 512)
    """
    usable = int(device_memory * USABLE_SHARE)
    fits = now.peak <= usable
    if not fits:
        passes = [k for k in range(now.accumulation + 1, now.batch_size + 1) if now.batch_size % k == 0]
        axes = [2 ** i for i in range(1, int(math.log2(_MOST_MODEL_AXIS)) + 1) if 2 ** i > now.mesh[1]]
        tried = set()
        for precision, accumulate, split in _candidates(now):
            for m in axes if split else [now.mesh[1]]:
                for k in passes if accumulate else [now.accumulation]:
                    if (precision, k, m) in tried:
                        continue
                    tried.add((precision, k, m))
                    new = memory_model.breakdown(now.batch_size, precision=precision, accumulation=k,
                                                 mesh=(now.mesh[0], m), target=now.target)
                    if new.peak <= usable:
                        return MemoryFit(device_memory, usable, source, fits, largest_batch(now, usable),
                                         Change(_describe(now, new), new.precision, k, new.mesh, new))
    return MemoryFit(device_memory, usable, source, fits, largest_batch(now, usable), None)
