"""`kfast.diagnose` (defined here): measure input, compute and end-to-end step time on the user's model and data.

NOTE [ A budget, and the same verdict twice ]: each of the three phases gets an equal share of what is
left of `budget_s` when it starts (a phase that ends early leaves its time to the next ones) and stops at
whichever comes first: `steps` timed steps, or the end of its share once `_LEAST` steps are timed, so a
slow model is measured in about `budget_s` and a fast one in `steps`. Each phase is summed up by the
median and interquartile range of the mean step time over consecutive stretches of its steps (see
`report.stretch_seconds`); a verdict the ranges do not settle is "uncertain" rather than a coin toss.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from kfast._core.checks import check_int
from kfast._core.checks import check_number
from kfast._core import fit_timing
from kfast._core import gpu_sampling
from kfast._core.tf_datasets import is_tf_dataset
from kfast import nvml
from kfast.data import structure
from kfast.diagnosis import reading
from kfast.diagnosis.report import Diagnosis

# Timed steps each phase takes whatever the budget: three stretches of two steps, enough for a range.
_LEAST = 6


class _Repeat(keras.utils.PyDataset):
    """One cached batch, `n` times: training on it measures the model alone.

    Served as `like` is served by Keras (its worker threads and queue, when it is a PyDataset that has
    them): the batches reach the step the same way, and TensorFlow's traced step, which depends on how the
    batches arrive, is the one the end-to-end phase uses too. Traced there instead, its first step would be
    slow enough for a loader to fill its queue, and the first timed steps would read that queue rather
    than the loader.
    """

    def __init__(self, batch: Any, n: int, like: Any = None) -> None:
        if isinstance(like, keras.utils.PyDataset):
            workers, processes, queue = like.workers, like.use_multiprocessing, like.max_queue_size
        else:
            workers, processes, queue = 1, False, 10
        threads = max(2, workers) if processes else workers  # threads: the same queue, nothing to pickle
        super().__init__(workers=threads, max_queue_size=queue)
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.batch


def compute_seconds(model: keras.Model, batch: Any, *, steps: int = 10, warmup: int = 3) -> np.ndarray:
    """Seconds of each of `steps` training steps on one cached `batch`: the model alone, no input, through
    fit's own train step. A model that is not built yet is built from `batch` first, as fit does; its
    weights and optimizer state are put back afterwards."""
    fit_timing.build_from_batch(model, batch)
    with fit_timing.state_kept(model):
        clock = fit_timing.StepClock(warmup + steps, warmup=warmup)
        return fit_timing.timed_fit(model, _Repeat(batch, warmup + steps), clock).step_seconds()


class _Budget:
    """Hands each phase its share of what is left of the budget."""

    def __init__(self, seconds: float, phases: int) -> None:
        self.end, self.left = time.perf_counter() + seconds, phases

    def deadline(self) -> float:
        now = time.perf_counter()
        share = max(0.0, self.end - now) / max(1, self.left)
        self.left -= 1
        return now + share


def _overlapped(data: Any) -> bool:
    """Whether training loads the next batch while the model computes: with a loader's or Keras's own
    workers, a tf.data pipeline, and on TensorFlow always (Keras's input pipeline prefetches); a
    single-worker PyDataset on JAX or PyTorch is read between steps."""
    if keras.backend.backend() == "tensorflow" or is_tf_dataset(data) or reading.is_loader(data):
        return True
    return getattr(data, "workers", 1) > 1 or bool(getattr(data, "use_multiprocessing", False))


def _kind(data: Any) -> tuple[str, bool]:
    """(what the advice calls the data, whether FastLoader accepts it: indexable Python batches)."""
    if is_tf_dataset(data):
        return "tf.data.Dataset", False
    indexable = hasattr(data, "__getitem__") and hasattr(data, "__len__")
    return type(data).__name__, indexable


def diagnose(model: keras.Model, data: Any, *, steps: int = 50, warmup: int = 5, budget_s: float = 20.0,
             sampler: gpu_sampling.Reader | None = None) -> Diagnosis:
    """Measures where a training step's time goes, and says what to change.

    Three short phases on the real compiled model and data: the data source alone (batches/s with no
    training), the model alone (training on one cached batch, the ceiling the model allows) and real
    training steps end to end; plus GPU utilisation through NVML when a GPU is visible. Each phase stops
    after `steps` timed steps or at the end of its share of `budget_s` (once 6 steps are timed), whichever
    comes first. Data with fewer batches than a phase takes is read for the passes it needs and no more,
    as training would; a dataset that changes its own attributes while serving is put back as it was, and
    the report names what changed. A model that is not built yet (a subclassed model, or one given only
    `model.build(input_shape)`) is built from the first batch, as `fit` does. The model's weights and
    optimizer state are put back afterwards.

    Args:
        model: a compiled Keras model.
        data: what you pass to `fit`: a `keras.utils.PyDataset` (a `FastLoader` too), a Keras `Sequence`,
            or a `tf.data.Dataset` / iterable of batches.
        steps: the most timed batches per phase. Defaults to `50`.
        warmup: untimed batches first (tracing, worker start-up). Defaults to `5`.
        budget_s: seconds the three phases may take together (warm-up and tracing included), beyond which
            each stops once it has timed 6 steps. Defaults to `20`.
        sampler: callable returning `(utilization_percent, memory_used_bytes)`. Defaults to `None`: NVML
            on this process's GPU, if any.

    Returns:
        A `Diagnosis`: print it, `to_dict()` it, or `plot("diagnosis.png")` it.

    Raises:
        ValueError: for non-positive `steps` or `budget_s`, negative `warmup`, an uncompiled model, or data
            without batches.

    Example:

    >>> import keras, numpy as np, kfast
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> d = kfast.diagnose(model, data, steps=8, warmup=1)  # print(d) shows the verdict and what to change
    >>> d.verdict in ("input-bound", "compute-bound", "balanced", "uncertain"), d.batch_size
    (True, 16)
    """
    check_int("diagnose", "steps", steps, hint="the most timed batches per phase")
    check_int("diagnose", "warmup", warmup, least=0, hint="untimed batches before each phase")
    check_number("diagnose", "budget_s", budget_s, above=0, unit="seconds", hint="e.g. budget_s=20")
    if fit_timing.batches_per_epoch(data) == 0:
        raise ValueError(f"diagnose got {type(data).__name__} with no batches; pass the data you train on.")
    guard = reading.DatasetGuard(data)  # before anything reads a batch
    try:
        fit_timing.build_if_needed("diagnose", model, data)  # compiled, and built: its weights are put back
        guard.restore()
        return _measure(model, data, steps=steps, warmup=warmup, budget=_Budget(budget_s, 3), guard=guard,
                        sampler=sampler)
    finally:
        guard.restore()


def _measure(model: keras.Model, data: Any, *, steps: int, warmup: int, budget: _Budget, guard: reading.DatasetGuard,
             sampler: gpu_sampling.Reader | None) -> Diagnosis:
    least = min(steps, _LEAST)
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
        guard.restore()
        spans[name] = (max((end for _, end in spans.values()), default=began), time.monotonic())
        if thread is not None:
            samples = thread.take()
            timeline.extend(samples)
            gpu[name] = gpu_sampling.summarize(samples)

    try:
        with fit_timing.state_kept(model):
            read = reading.read_input(data, warmup=warmup, steps=steps, least=least, deadline=budget.deadline(),
                                      guard=guard)
            times["input"] = np.array(read.seconds)
            phase_end("input")
            clock = fit_timing.StepClock(warmup + steps, warmup=warmup, deadline=budget.deadline(), least=least)
            repeat = _Repeat(read.first, warmup + steps, like=data)
            times["compute"] = fit_timing.timed_fit(model, repeat, clock).step_seconds()
            phase_end("compute")
            # The compute phase traced the step for batches served this way (see _Repeat): no slow first step.
            clock = fit_timing.StepClock(warmup + steps, warmup=warmup, deadline=budget.deadline(), least=least)
            put_back = guard.callback()
            fit_timing.timed_fit(model, data, clock, callbacks=[put_back] if put_back else None)
            times["end_to_end"] = clock.step_seconds()
            phase_end("end_to_end")
    finally:
        if thread is not None:
            thread.stop()
    length = fit_timing.batches_per_epoch(data)
    epoch_starts = [i for i in range(len(times["end_to_end"])) if length and (warmup + i) % length == 0 and warmup + i]
    kind, indexable = _kind(data)
    settings = getattr(data, "settings", None)
    return Diagnosis(times, structure.batch_size(read.first), gpu=gpu or None, gpu_reason=gpu_reason,
                     gpu_timeline=timeline, phases=spans, epoch_starts=epoch_starts, data_kind=kind,
                     workers=settings["workers"] if settings is not None else None, indexable=indexable,
                     overlapped=_overlapped(data),
                     dataset_notes=read.notes + guard.notes(), current=_current(model, data))


def _current(model: keras.Model, data: Any) -> dict[str, Any]:
    """What the user already set that the advice could otherwise propose again."""
    settings = getattr(data, "settings", None)
    policy = getattr(getattr(model, "dtype_policy", None), "name", "") or ""
    return {"max_queue_size": settings["max_queue_size"] if settings is not None else None,
            "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
            "mixed_precision": policy.startswith("mixed"),
            # tf.data names the dataset a pipeline's last step makes: a final .prefetch() is one to leave.
            "prefetched": is_tf_dataset(data) and type(data).__name__ == "_PrefetchDataset"}
