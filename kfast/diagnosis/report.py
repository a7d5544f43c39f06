"""Diagnosis: what `kfast.diagnose` measured, its verdict, what to change, and how to show it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import numpy as np

from kfast._core.cpus import usable_cpus
from kfast._core.step_shares import StepShares
from kfast.diagnosis import advice
from kfast.diagnosis import verdict as rules
from kfast.diagnosis.verdict import BALANCED  # noqa: F401 - the verdicts, importable from here as before
from kfast.diagnosis.verdict import COMPUTE_BOUND  # noqa: F401
from kfast.diagnosis.verdict import INPUT_BOUND  # noqa: F401
from kfast.diagnosis.verdict import UNCERTAIN

_PHASES = ("input", "compute", "end_to_end")


class Diagnosis:
    """Where a training step's time goes, measured by `kfast.diagnose`.

    Attributes:
        verdict: "input-bound", "compute-bound", "balanced", or "uncertain" when the phases' ranges allow
            more than one of the other three (`could_be` lists them).
        could_be: the verdicts the measurement allows, the one at the typical step times first.
        lost_fraction: share of the end-to-end step time not explained by compute: waiting for input, or
            handing batches over. `lost_range` is its `(low, high)` over the phases' ranges.
        input_wait_fraction: share of the end-to-end steps' time spent waiting for input (see
            `step_breakdown`).
        overlapped: whether training loaded the next batch while the model computed (Keras's or a
            loader's workers, tf.data, or TensorFlow's prefetch), which decides what input can cost a step.
        input_batches_per_s, compute_steps_per_s, end_to_end_steps_per_s: the three measured rates, at the
            typical step times.
        step_ranges: `{phase: (low, typical, high)}` seconds per step; typical is the median, and low to
            high the interquartile range, of the mean step time over consecutive stretches of the phase.
        batch_size: samples per batch (first batch's first dimension).
        gpu: per-phase GPU summaries (`gpu_util_mean`, ...) or `None`; `gpu_reason` says why none.
        dataset_notes: what diagnose noticed about the data: batches that changed between passes,
            attributes the dataset rebinds while serving (put back as they were).
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
                 data_kind: str = "dataset", workers: int | None = None, *, indexable: bool = True,
                 overlapped: bool = True, dataset_notes: Iterable[str] | None = None,
                 current: Mapping[str, Any] | None = None) -> None:
        self.times = {k: [float(t) for t in v] for k, v in times.items()}
        self.batch_size = batch_size
        self.gpu, self.gpu_reason, self.gpu_timeline = gpu, gpu_reason, gpu_timeline or []
        self.phases, self.epoch_starts = phases or {}, list(epoch_starts or [])
        self.dataset_notes = list(dataset_notes or [])
        self.step_ranges = {k: rules.stretch_seconds(self.times[k]) for k in _PHASES}
        t_in, t_comp, t_e2e = (self.step_ranges[k][1] for k in _PHASES)
        self.input_batches_per_s = 1 / t_in
        self.compute_steps_per_s = 1 / t_comp
        self.end_to_end_steps_per_s = 1 / t_e2e
        self.overlapped = overlapped
        # One accounting (NOTE [ One accounting of a step ]): the verdict, the text, the picture and the
        # advice all read these shares of the typical step.
        self.shares: StepShares = rules.shares(t_in, t_comp, t_e2e, overlapped)
        self.lost_fraction = rules.lost(t_comp, t_e2e)
        self.input_wait_fraction = self.shares.fraction("input_wait")
        self.could_be, self.lost_range = rules.possible(self.step_ranges, overlapped)
        self.verdict = self.could_be[0] if len(self.could_be) == 1 else UNCERTAIN
        idle = (self.gpu or {}).get("end_to_end", {}).get("gpu_idle_fraction")
        # As printed (whole percents that add up to 100), so that the advice quotes the text's numbers.
        pct = self.shares.percents()
        # What the user already set (the loader's queue, steps_per_execution, the dtype policy), so that no
        # advice proposes it again.
        now = dict(current or {})
        self.recommendations = advice.recommend(advice.Facts(
            likely=self.could_be[0], could_be=tuple(self.could_be), lost=self.lost_fraction,
            lost_range=self.lost_range, t_in=t_in, t_comp=t_comp, batch_size=batch_size, data_kind=data_kind,
            indexable=indexable, workers=workers, cpus=usable_cpus(), gpu_idle=idle,
            dataset_changes=bool(self.dataset_notes), input_wait=pct["input_wait"] / 100, other=pct["other"] / 100,
            max_queue_size=now.get("max_queue_size"), steps_per_execution=int(now.get("steps_per_execution") or 1),
            mixed_precision=bool(now.get("mixed_precision")), prefetched=bool(now.get("prefetched"))))

    def to_dict(self) -> dict[str, Any]:
        """Returns every measured number, the verdict and the recommendations as plain Python types."""
        return {"verdict": self.verdict, "could_be": self.could_be, "shares": self.shares.fractions(),
                "lost_fraction": self.lost_fraction,
                "lost_range": list(self.lost_range), "input_wait_fraction": self.input_wait_fraction,
                "batch_size": self.batch_size, "input_batches_per_s": self.input_batches_per_s,
                "compute_steps_per_s": self.compute_steps_per_s, "end_to_end_steps_per_s": self.end_to_end_steps_per_s,
                "step_ranges": {k: list(v) for k, v in self.step_ranges.items()}, "gpu": self.gpu,
                "gpu_reason": self.gpu_reason, "dataset_notes": self.dataset_notes,
                "recommendations": self.recommendations, "times": self.times}

    def to_json(self) -> str:
        """Returns `to_dict()` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        b = self.batch_size
        rows = [("input alone", "input", "batches/s"), ("compute alone", "compute", "steps/s"),
                ("end to end", "end_to_end", "steps/s")]
        lo, hi = self.lost_range
        head = f"could be {' or '.join(self.could_be)}; " if self.verdict == UNCERTAIN else ""
        lines = [f"kfast diagnosis: {self.verdict.upper()} ({head}{self.headline()}, {lo:.0%} to {hi:.0%} over the "
                 "ranges)", f"  a typical step ({self.shares.step * 1e3:.2f} ms): {self.shares}", "",
                 f"  {'phase':<14} {'rate':>10} {'unit':<10} {'samples/s':>10} {'ms/batch':>9}  {'range (ms)':<15} steps"]
        for name, key, unit in rows:
            low, typical, high = self.step_ranges[key]
            rate = 1 / typical
            lines.append(f"  {name:<14} {rate:>10.1f} {unit:<10} {rate * b:>10.0f} {typical * 1e3:>9.2f}  "
                         f"{f'{low * 1e3:.2f}-{high * 1e3:.2f}':<15} {len(self.times[key])}")
        if self.gpu:
            for phase, g in self.gpu.items():
                if not g:  # a phase shorter than the sampling interval has no samples
                    lines.append(f"  GPU {phase:<10} no sample (the phase was shorter than the sampling interval)")
                    continue
                lines.append(f"  GPU {phase:<10} busy {g['gpu_util_mean']:.0f}% (p10 {g['gpu_util_p10']:.0f}%), idle in "
                             f"{g['gpu_idle_fraction']:.0%} of samples, memory max {g['gpu_mem_used_max'] / 2**20:.0f} MiB")
        else:
            lines.append(f"  GPU: not measured ({self.gpu_reason})")
        if self.dataset_notes:
            lines += ["", "Dataset:"] + [f"  - {note}." for note in self.dataset_notes]
        lines += ["", "What to do:"] + [f"  {i}. {r}" for i, r in enumerate(self.recommendations, 1)]
        return "\n".join(lines)

    def headline(self) -> str:
        """The verdict's reason in a few words, from `shares`, as the text and the picture print it.

        Example:

        >>> Diagnosis({"input": [0.03] * 4, "compute": [0.01] * 4, "end_to_end": [0.03] * 4}, 32).headline()
        '67% of each step not spent computing'
        """
        return f"{100 - self.shares.percents()['compute']}% of each step not spent computing"

    def step_breakdown(self) -> dict[str, np.ndarray]:
        """Splits each measured end-to-end step into compute, input wait and other time.

        The same accounting as `shares` (NOTE [ One accounting of a step ]), step by step: compute is the
        model's own step (the typical compute-alone step), or the whole of a faster step. When training
        loads the next batch while the model computes (`overlapped`), slow input costs a step what loading
        a batch takes beyond a compute step (typical input-alone minus compute); when batches are read
        between steps, what loading one takes. That, up to what the step leaves, is the input wait. Other
        is the rest: handing the batch over (Keras's iterator, conversion, the copy to the device), Python
        and framework overhead, and steps slower than the typical times explain.

        Returns:
            A dict of numpy arrays, seconds per end-to-end step: `compute`, `input_wait` and `other`; per
            step they add up to `times["end_to_end"]`.

        Example:

        >>> d = Diagnosis({"input": [0.03] * 4, "compute": [0.01] * 4, "end_to_end": [0.025, 0.03, 0.04]}, 32)
        >>> {k: [round(t * 1e3) for t in v] for k, v in d.step_breakdown().items()}
        {'compute': [10, 10, 10], 'input_wait': [15, 20, 20], 'other': [0, 0, 10]}
        """
        t_in, t_comp = self.step_ranges["input"][1], self.step_ranges["compute"][1]
        cost = rules.input_cost(t_in, t_comp, self.overlapped)
        steps = [StepShares.split(t, compute=t_comp, input_wait=cost) for t in self.times["end_to_end"]]
        return {part: np.array([getattr(s, part) for s in steps], dtype=float) for part in ("compute", "input_wait",
                                                                                             "other")}

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
