"""`kfast.diagnose` (defined here): measure input, compute and end-to-end step time on the user's model and data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kfast._core.checks import check_int
from kfast._core import fit_timing
from kfast._core import gpu_sampling
from kfast import nvml
from kfast.data import structure
from kfast.diagnosis.report import Diagnosis


class _Repeat(keras.utils.PyDataset):
    """One cached batch, `n` times: training on it measures the model alone."""

    def __init__(self, batch: Any, n: int) -> None:
        super().__init__()
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.batch


def _batches(data: Any, count: int) -> Iterator[Any]:
    """Yields `count` batches from a PyDataset-like object or an iterable, wrapping around."""
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not hasattr(data, "wait_seconds"):
        for i in range(count):
            yield data[i % len(data)]
        return
    # An iterable, or a FastLoader (read its prefetched stream): one pass per epoch until `count`.
    while count:
        before = count
        for batch in data:
            yield batch
            count -= 1
            if not count:
                return
        if count == before:
            raise ValueError(f"diagnose got {type(data).__name__} that yields no batches when iterated again; pass "
                             "data that can be read more than once (a keras.utils.PyDataset or a tf.data.Dataset).")


def first_batch(data: Any) -> Any:
    """The first batch of `data` (a PyDataset-like object, a FastLoader or an iterable)."""
    for batch in _batches(data, 1):
        return batch
    raise ValueError(f"got {type(data).__name__} with no batches; pass the data you train on.")


def compute_seconds(model: keras.Model, batch: Any, *, steps: int = 10, warmup: int = 3) -> np.ndarray:
    """Seconds of each of `steps` training steps on one cached `batch`: the model alone, no input, through
    fit's own train step. The model's weights and optimizer state are put back afterwards."""
    with fit_timing.state_kept(model):
        return _fit(model, _Repeat(batch, warmup + steps), warmup + steps)[warmup:]


def _fit(model: keras.Model, data: Any, steps: int) -> np.ndarray:
    """Trains `steps` steps and returns each one's seconds; data shorter than that is read for several epochs."""
    return fit_timing.timed_fit(model, data, fit_timing.StepClock(steps)).step_seconds()


def diagnose(model: keras.Model, data: Any, *, steps: int = 50, warmup: int = 5,
             sampler: gpu_sampling.Reader | None = None) -> Diagnosis:
    """Measures where a training step's time goes, and says what to change.

    Three short phases on the real compiled model and data: the data source alone (batches/s with no
    training), the model alone (training on one cached batch, the ceiling the model allows) and real
    training steps end to end; plus GPU utilisation through NVML when a GPU is visible. Data with fewer
    than `warmup + steps` batches is read for several epochs, as training would. The model's weights and
    optimizer state are put back afterwards.

    Args:
        model: a compiled Keras model.
        data: what you pass to `fit`: a `keras.utils.PyDataset` (a `FastLoader` too), a Keras `Sequence`,
            or a `tf.data.Dataset` / iterable of batches.
        steps: timed batches per phase. Defaults to `50`.
        warmup: untimed batches first (tracing, worker start-up). Defaults to `5`.
        sampler: callable returning `(utilization_percent, memory_used_bytes)`. Defaults to `None`: NVML
            on this process's GPU, if any.

    Returns:
        A `Diagnosis`: print it, `to_dict()` it, or `plot("diagnosis.png")` it.

    Raises:
        ValueError: for non-positive `steps`, negative `warmup`, an uncompiled model, or data without batches.

    Example:

    >>> import keras, numpy as np, kfast
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> d = kfast.diagnose(model, data, steps=4, warmup=1)  # print(d) shows the verdict and what to change
    >>> d.verdict in ("input-bound", "compute-bound", "balanced"), d.batch_size
    (True, 16)
    """
    check_int("diagnose", "steps", steps, hint="timed batches per phase")
    check_int("diagnose", "warmup", warmup, least=0, hint="untimed batches before each phase")
    fit_timing.check_model("diagnose", model)  # compiled, and built: its weights are put back afterwards
    total = warmup + steps
    if fit_timing.batches_per_epoch(data) == 0:
        raise ValueError(f"diagnose got {type(data).__name__} with no batches; pass the data you train on.")
    gpu_reason = None
    if sampler is None:
        try:
            sampler = gpu_sampling.local_sampler()
        except nvml.NvmlUnavailable as e:
            gpu_reason = str(e)
    # Stopped in the `finally` below, whatever happens in between.
    thread = gpu_sampling.GpuSampler(sampler, 0.05).start() if sampler else None

    times: dict[str, np.ndarray] = {}
    gpu: dict[str, dict[str, float]] = {}
    timeline: list[gpu_sampling.Sample] = []
    spans: dict[str, tuple[float, float]] = {}
    began = time.monotonic()  # the sampler's clock, for the picture's GPU timeline

    def phase_end(name: str) -> None:
        spans[name] = (max((end for _, end in spans.values()), default=began), time.monotonic())
        if thread is not None:
            samples = thread.take()
            timeline.extend(samples)
            gpu[name] = gpu_sampling.summarize(samples)

    try:
        with fit_timing.state_kept(model):
            first, stamps = None, [time.perf_counter()]
            for batch in _batches(data, total):
                first = batch if first is None else first
                stamps.append(time.perf_counter())
            times["input"] = np.diff(stamps)[warmup:]
            phase_end("input")
            times["compute"] = _fit(model, _Repeat(first, total), total)[warmup:]
            phase_end("compute")
            times["end_to_end"] = _fit(model, data, total)[warmup:]
            phase_end("end_to_end")
    finally:
        if thread is not None:
            thread.stop()
    batch_size = structure.batch_size(first)
    settings = getattr(data, "settings", None)
    length = fit_timing.batches_per_epoch(data)
    epoch_starts = [i for i in range(steps) if length and (warmup + i) % length == 0 and warmup + i]
    return Diagnosis(times, batch_size, gpu=gpu or None, gpu_reason=gpu_reason, gpu_timeline=timeline,
                     phases=spans, epoch_starts=epoch_starts, data_kind=type(data).__name__,
                     workers=settings["workers"] if settings is not None else None)
