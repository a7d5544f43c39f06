"""Diagnosis: what `kfast.diagnose` measured, its verdict, what to change, and how to show it."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import numpy as np

from kfast._core.cpus import usable_cpus

INPUT_BOUND = "input-bound"
COMPUTE_BOUND = "compute-bound"
BALANCED = "balanced"


def _median(times: Any) -> float:
    return float(np.median(times)) if len(times) else float("nan")


class Diagnosis:
    """Where a training step's time goes, measured by `kfast.diagnose`.

    Attributes:
        verdict: "input-bound", "compute-bound" or "balanced".
        lost_fraction: share of the end-to-end step time not explained by compute: waiting for input, or
            handing batches over.
        input_batches_per_s, compute_steps_per_s, end_to_end_steps_per_s: the three measured rates.
        batch_size: samples per batch (first batch's first dimension).
        gpu: per-phase GPU summaries (`gpu_util_mean`, ...) or `None`; `gpu_reason` says why none.
        recommendations: what to change, most important first.
        times: per-batch seconds of each phase, for plots.
        gpu_timeline: `(time.monotonic(), utilization_percent, memory_used_bytes)` samples, possibly empty.
        phases: `{phase: (start, end)}` on the same clock as `gpu_timeline`.
        epoch_starts: end-to-end steps (counted from 0) that began a new pass over data shorter than the
            measurement.
    """

    def __init__(self, times: Mapping[str, Iterable[float]], batch_size: int,
                 gpu: dict[str, dict[str, float]] | None = None, gpu_reason: str | None = None,
                 gpu_timeline: list[tuple[float, float, int]] | None = None,
                 phases: dict[str, tuple[float, float]] | None = None, epoch_starts: Iterable[int] | None = None,
                 data_kind: str = "dataset", workers: int | None = None) -> None:
        self.times = {k: [float(t) for t in v] for k, v in times.items()}
        self.batch_size = batch_size
        self.gpu, self.gpu_reason, self.gpu_timeline = gpu, gpu_reason, gpu_timeline or []
        self.phases, self.epoch_starts = phases or {}, list(epoch_starts or [])
        t_in, t_comp, t_e2e = (_median(self.times[k]) for k in ("input", "compute", "end_to_end"))
        self.input_batches_per_s = 1 / t_in
        self.compute_steps_per_s = 1 / t_comp
        self.end_to_end_steps_per_s = 1 / t_e2e
        self.lost_fraction = max(0.0, (t_e2e - t_comp) / t_e2e)
        if self.lost_fraction >= 0.25 and t_in > t_comp:
            self.verdict = INPUT_BOUND
        elif self.lost_fraction < 0.10 or (2 * t_in <= t_comp and self.lost_fraction < 0.25):
            # A little lost time beside an input twice as fast as the model is hand-over noise, not input.
            self.verdict = COMPUTE_BOUND
        else:
            self.verdict = BALANCED
        self.recommendations = self._recommend(t_in, t_comp, data_kind, workers, usable_cpus())

    def _recommend(self, t_in: float, t_comp: float, data_kind: str, workers: int | None, cpus: int) -> list[str]:
        b = self.batch_size
        out: list[str] = []
        if self.verdict != COMPUTE_BOUND and t_in > t_comp:
            feed = (f"input delivers {b / t_in:.0f} samples/s, the model consumes {b / t_comp:.0f}; "
                    f"{self.lost_fraction:.0%} of each step is lost waiting for data")
            if data_kind == "FastLoader":
                need = math.ceil((workers or 1) * t_in / t_comp)
                out.append(f"{feed}: raise the loader's workers from {workers} to {min(need, 2 * cpus)} "
                           "or let kfast.tune(dataset) pick them.")
            else:
                need = math.ceil(t_in / t_comp)
                out.append(f"{feed}: wrap the dataset in kfast.data.FastLoader(dataset, workers={min(need, cpus)}) "
                           "to load batches in parallel processes.")
            if need > cpus:
                out.append(f"loading a batch costs {need}x a training step of CPU time but this machine has {cpus} "
                           "core(s): make __getitem__ cheaper (decode once and cache, smaller images, vectorised "
                           "numpy) or move augmentation into the model.")
        elif self.lost_fraction >= 0.10:
            out.append(f"the input alone is fast ({b / t_in:.0f} samples/s) but {self.lost_fraction:.0%} of each step "
                       "is lost handing batches over: compile with steps_per_execution > 1 to run several steps "
                       "per call, and keep batches loading ahead (FastLoader max_queue_size).")
        idle = (self.gpu or {}).get("end_to_end", {}).get("gpu_idle_fraction")
        if idle is not None and idle > 0.2 and self.verdict != COMPUTE_BOUND:
            out.append(f"the GPU was idle in {idle:.0%} of samples during training: raise the loader's "
                       "max_queue_size so more batches are ready ahead.")
        if self.verdict != INPUT_BOUND:
            out.append(f"the model is the limit at {b / t_comp:.0f} samples/s: try a larger batch size if memory "
                       "allows, mixed precision (keras.mixed_precision.set_global_policy('mixed_float16')) on GPUs "
                       "with tensor cores, or more GPUs with horovodrun.")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Returns every measured number, the verdict and the recommendations as plain Python types."""
        return {"verdict": self.verdict, "lost_fraction": self.lost_fraction, "batch_size": self.batch_size,
                "input_batches_per_s": self.input_batches_per_s, "compute_steps_per_s": self.compute_steps_per_s,
                "end_to_end_steps_per_s": self.end_to_end_steps_per_s, "gpu": self.gpu,
                "gpu_reason": self.gpu_reason, "recommendations": self.recommendations, "times": self.times}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        b = self.batch_size
        rows = [("input alone", self.input_batches_per_s, "batches/s"),
                ("compute alone", self.compute_steps_per_s, "steps/s"),
                ("end to end", self.end_to_end_steps_per_s, "steps/s")]
        lines = [f"kfast diagnosis: {self.verdict.upper()} ({self.lost_fraction:.0%} of step time not spent computing)", "",
                 f"  {'phase':<14} {'rate':>10} {'unit':<10} {'samples/s':>10} {'ms/batch':>9}"]
        for name, rate, unit in rows:
            lines.append(f"  {name:<14} {rate:>10.1f} {unit:<10} {rate * b:>10.0f} {1e3 / rate:>9.2f}")
        if self.gpu:
            for phase, g in self.gpu.items():
                if not g:  # a phase shorter than the sampling interval has no samples
                    lines.append(f"  GPU {phase:<10} no sample (the phase was shorter than the sampling interval)")
                    continue
                lines.append(f"  GPU {phase:<10} busy {g['gpu_util_mean']:.0f}% (p10 {g['gpu_util_p10']:.0f}%), idle in "
                             f"{g['gpu_idle_fraction']:.0%} of samples, memory max {g['gpu_mem_used_max'] / 2**20:.0f} MiB")
        else:
            lines.append(f"  GPU: not measured ({self.gpu_reason})")
        lines += ["", "What to do:"] + [f"  {i}. {r}" for i, r in enumerate(self.recommendations, 1)]
        return "\n".join(lines)

    def step_breakdown(self) -> dict[str, np.ndarray]:
        """Splits each measured end-to-end step into compute, input wait and other time.

        Compute is the model's own step (the compute-alone median). Keras loads the next batch while the
        model computes, so slow input costs each step what loading a batch takes beyond a compute step (the
        input-alone median minus the compute median): that is the input wait, up to what the step leaves.
        Other is the rest: handing the batch over (Keras's iterator, conversion, the copy to the device),
        Python overhead, and steps slower than the medians explain.

        Returns:
            A dict of numpy arrays, seconds per end-to-end step: `compute`, `input_wait` and `other`; per
            step they add up to `times["end_to_end"]`.

        Example:

        >>> d = Diagnosis({"input": [0.03] * 3, "compute": [0.01] * 3, "end_to_end": [0.025, 0.03, 0.04]}, 32)
        >>> {k: [round(t * 1e3) for t in v] for k, v in d.step_breakdown().items()}
        {'compute': [10, 10, 10], 'input_wait': [15, 20, 20], 'other': [0, 0, 10]}
        """
        step = np.array(self.times["end_to_end"])
        t_in, t_comp = _median(self.times["input"]), _median(self.times["compute"])
        compute = np.minimum(step, t_comp)
        wait = np.minimum(step - compute, max(0.0, t_in - t_comp))
        return {"compute": compute, "input_wait": wait, "other": step - compute - wait}

    def plot(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        """Writes a PNG of where each measured training step's time went.

        Stacked bars per end-to-end step (compute, input wait, other; see `step_breakdown`) under the
        verdict and the measured rates, the first thing to do, and GPU utilisation over the three phases
        when NVML was read. It draws on its own figure and canvas, so a notebook's matplotlib backend is
        left as it was.

        Args:
            path: the PNG file to write.

        Returns:
            `path`.
        """
        from kfast.diagnosis import plot

        plot.draw(self, path)
        return path
