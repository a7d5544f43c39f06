"""`kfast.tune` (defined here): pick FastLoader's workers, processes or threads, and queue depth by measuring.

A `tf.data.Dataset` is handed to `kfast.tuning.tf_data`, which tunes the pipeline itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import overload

import keras

from kfast._core.checks import check_int, check_number
from kfast._core.cpus import doublings
from kfast._core.cpus import usable_cpus
from kfast._core import fit_timing
from kfast._core import tf_datasets
from kfast.tuning import cache as tune_cache
from kfast.tuning import tf_data
from kfast.tuning.tf_data_result import TfDataTuneResult
from kfast.data.loader import FastLoader
from kfast.data.settings import LoaderSettings


class TuneResult:
    """The configuration `kfast.tune` chose, how fast it was, and every trial it measured.

    Attributes:
        settings: the chosen `LoaderSettings` (`workers`, `use_multiprocessing`, `max_queue_size`, also
            readable as attributes of the result).
        batches_per_s: the chosen configuration's measured throughput.
        trials: one dict per measurement (`workers`, `use_multiprocessing`, `max_queue_size`, `batches_per_s`).
        from_cache: True when read from the cache rather than measured now.
    """

    def __init__(self, workers: int, use_multiprocessing: bool, max_queue_size: int, batches_per_s: float,
                 trials: list[dict[str, Any]], from_cache: bool = False) -> None:
        self.settings = LoaderSettings(workers, use_multiprocessing, max_queue_size)
        self.batches_per_s, self.trials, self.from_cache = batches_per_s, trials, from_cache

    @property
    def workers(self) -> int:
        return self.settings.workers

    @property
    def use_multiprocessing(self) -> bool:
        return self.settings.use_multiprocessing

    @property
    def max_queue_size(self) -> int:
        return self.settings.max_queue_size

    def loader(self, dataset: Any, *, training: bool = True, **kwargs: Any) -> FastLoader:
        """Returns a FastLoader over `dataset` with the chosen settings: by default the data `fit` trains on
        (`training=True`: shuffled, each rank its shard); `training=False` for data to evaluate or predict on.
        `shuffle`, `seed` and the other FastLoader arguments pass through."""
        return FastLoader(dataset, training=training, **self.settings, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {**self.settings.to_dict(), "batches_per_s": self.batches_per_s, "trials": self.trials}

    def __str__(self) -> str:
        lines = [f"{'mode':<10} {'workers':>7} {'queue':>6} {'batches/s':>10}"]
        for t in self.trials:
            mode = "processes" if t["use_multiprocessing"] else "threads"
            chosen = " <- chosen" if LoaderSettings.from_dict(t) == self.settings else ""
            lines.append(f"{mode:<10} {t['workers']:>7} {t['max_queue_size']:>6} {t['batches_per_s']:>10.1f}{chosen}")
        source = " (from cache)" if self.from_cache else ""
        return "\n".join(lines + [f"chosen: {self.settings}, {self.batches_per_s:.1f} batches/s{source}"])


def measure_loader(dataset: Any, workers: int, use_multiprocessing: bool, max_queue_size: int,
                   seconds: float = 1.0) -> float:
    """Batches/s of a FastLoader with these settings, after start-up and a warm-up of one queue's worth."""
    with FastLoader(dataset, workers=workers, use_multiprocessing=use_multiprocessing,
                    max_queue_size=max_queue_size) as loader:
        n = len(loader)
        stream = iter(())
        done = 0

        def next_batch():
            nonlocal stream
            try:
                return next(stream)
            except StopIteration:
                stream = iter(loader)
                return next(stream)

        for _ in range(max(2, max_queue_size)):
            next_batch()
        start = time.perf_counter()
        while done < 3 or (time.perf_counter() - start < seconds and done < 20 * n):
            next_batch()
            done += 1
        return done / (time.perf_counter() - start)


def _search(measure: Callable[[int, bool, int], float], max_workers: int, *, target: float | None = None,
            budget_s: float = 30, clock: Callable[[], float] = time.monotonic,
            progress: Callable[[dict[str, Any]], None] | None = None) -> TuneResult:
    """Runs the search with `measure(workers, use_multiprocessing, max_queue_size) -> batches/s` and
    returns the `TuneResult`; `tune` passes real FastLoader bursts, tests pass scripted rates and clocks."""
    trials = []
    start = clock()

    def trial(workers, processes, queue):
        rate = measure(workers, processes, queue)
        trials.append({"workers": workers, "use_multiprocessing": processes, "max_queue_size": queue,
                       "batches_per_s": rate})
        if progress:
            progress(trials[-1])
        return rate

    def out_of_time():
        return clock() - start > budget_s

    def done(rate):
        return target is not None and rate >= target

    counts = doublings(max_workers)
    for processes in (False, True):
        best_here = 0.0
        for workers in counts:
            rate = trial(workers, processes, 2 * workers)
            # More workers past a plateau, or past what the model consumes, only steal CPU from training.
            if rate < best_here * 1.05 or done(rate) or out_of_time():
                break
            best_here = rate
        if out_of_time() or done(max(t["batches_per_s"] for t in trials)):
            break
    best = _choose(trials)
    if not out_of_time() and not done(best["batches_per_s"]):
        trial(best["workers"], best["use_multiprocessing"], 4 * best["workers"])  # a deeper queue
        best = _choose(trials)
    return TuneResult(best["workers"], best["use_multiprocessing"], best["max_queue_size"], best["batches_per_s"],
                      trials)


def _choose(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The cheapest trial within 5% of the fastest: fewer workers and a shorter queue leave CPU and memory
    to training, and a difference under 5% is within a burst's noise."""
    fastest = max(t["batches_per_s"] for t in trials)
    good = [t for t in trials if t["batches_per_s"] * 1.05 >= fastest]
    return min(good, key=lambda t: (t["workers"], t["max_queue_size"], -t["batches_per_s"]))


class _Batches(Protocol):
    """What a PyDataset offers FastLoader; a `tf.data.Dataset` has no `__getitem__`."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


# A dataset with batches by index gets a TuneResult; anything else may be a tf.data pipeline.
@overload
def tune(dataset: _Batches, *, model: keras.Model | None = ..., budget_s: float = ..., max_workers: int | None = ...,
         target_batches_per_s: float | None = ..., force: bool = ...,
         progress: Callable[[dict[str, Any]], None] | None = ...) -> TuneResult: ...


@overload
def tune(dataset: Any, *, model: keras.Model | None = ..., budget_s: float = ..., max_workers: int | None = ...,
         target_batches_per_s: float | None = ..., force: bool = ...,
         progress: Callable[[dict[str, Any]], None] | None = ...) -> TuneResult | TfDataTuneResult: ...


def tune(dataset: Any, *, model: keras.Model | None = None, budget_s: float = 30, max_workers: int | None = None,
         target_batches_per_s: float | None = None, force: bool = False,
         progress: Callable[[dict[str, Any]], None] | None = None) -> TuneResult | TfDataTuneResult:
    """Finds the fastest FastLoader settings for `dataset` on this machine, by measuring.

    Tries threads, then processes, with 1, 2, 4, ... workers (up to `max_workers`), each in a short burst
    after warm-up; stops adding workers when throughput stops rising by 5%, once it exceeds
    `target_batches_per_s` (what the model can consume, e.g. `kfast.diagnose(...).compute_steps_per_s`),
    or when `budget_s` is spent; then tries a deeper queue for the winner. The result is cached per host
    and dataset signature (class, length, batch structure and shapes) and reused unless `force=True`; a
    malformed cache entry is ignored with a warning and measured again, and a cache that cannot be written
    (see `KFAST_CACHE_DIR`) costs a warning, not the result.

    Without `model` a burst reads batches as fast as the loader makes them. With a compiled `model`, each
    burst trains it through `fit`'s own step and counts steps/s: the training step competes with the
    loader for the cores (and, with threads, for the GIL), so the setting that makes batches fastest on
    its own is not always the one that trains fastest. The model's weights and optimizer state are put
    back afterwards.

    A `tf.data.Dataset` is tuned as the pipeline it is: its `tf.data.Options`, a `prefetch` appended, and
    `cache()` where two passes give the same batches and an epoch fits in memory; the result is a
    `TfDataTuneResult`, whose `loader(dataset)` returns the tuned `tf.data.Dataset`. `max_workers` then
    bounds the private thread pool tried, and nothing is cached on disk (see `kfast.tuning.tf_data`).

    Args:
        dataset: anything FastLoader accepts, or a `tf.data.Dataset`.
        model: a compiled Keras model to measure training steps with. Defaults to `None`: the loader alone.
        budget_s: time budget in seconds. Defaults to `30`.
        max_workers: the most workers to try. Defaults to `None`: twice the usable CPU cores.
        target_batches_per_s: stop once this rate is reached. Defaults to `None`.
        force: measure even when a cached result exists. Defaults to `False`.
        progress: called with each trial's dict as it finishes. Defaults to `None`.

    Returns:
        A `TuneResult`; `result.loader(dataset)` builds the configured FastLoader. For a `tf.data.Dataset`,
        a `TfDataTuneResult`; `result.loader(dataset)` is the tuned pipeline.

    Raises:
        ValueError: for a budget that is not a finite number > 0, a max_workers that is not a positive
            int or None, or a model that is not compiled and built.

    Example:

    >>> import numpy as np, kfast
    >>> data = kfast.data.ArrayDataset(np.zeros((64, 4)), np.zeros(64), batch_size=8)
    >>> result = kfast.tune(data, budget_s=1, max_workers=1)
    >>> sorted(result.settings)
    ['max_queue_size', 'use_multiprocessing', 'workers']
    >>> with result.loader(data) as loader:  # pass this loader to model.fit
    ...     len(loader)
    8

    A `tf.data.Dataset` is tuned in place of the loader:

    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.range(64).map(lambda i: (tf.cast(i, "float32"), i % 2)).batch(8)
    >>> tuned = kfast.tune(ds, budget_s=1).loader(ds)  # a tf.data.Dataset to pass to model.fit
    >>> sum(int(tf.size(y)) for _, y in tuned)
    64
    """
    if tf_datasets.is_tf_dataset(dataset):  # a built pipeline: tf.data's options, prefetch and cache
        return tf_data.tune_tf_data(dataset, model=model, budget_s=budget_s, max_workers=max_workers,
                                    target_batches_per_s=target_batches_per_s, progress=progress)
    check_number("tune", "budget_s", budget_s, above=0, unit="seconds", hint="e.g. budget_s=30")
    cpus = usable_cpus()
    # Validated before defaulting: only None means "the default"; 0 is a mistake, not a request for it.
    check_int("tune", "max_workers", max_workers, or_none=f"for twice the usable CPU cores ({2 * cpus})")
    if max_workers is None:
        max_workers = 2 * cpus
    if model is not None:
        fit_timing.build_if_needed("tune", model, dataset)  # compiled; built from the first batch as fit does
    key = tune_cache.signature(dataset, model)
    # An explicit max_workers above 4x the cores is honoured; a cached count beyond both is not tune's.
    cached = None if force else tune_cache.load(key, most_workers=max(max_workers, 4 * cpus))
    # A result measured with a larger max_workers breaks this call's limit: measure within it instead.
    if cached and cached["workers"] <= max_workers:
        return TuneResult(cached["workers"], cached["use_multiprocessing"], cached["max_queue_size"],
                          cached["batches_per_s"], cached["trials"], from_cache=True)
    # Each burst is at most a tenth of the budget, so the search fits it.
    burst = max(0.3, min(2.0, budget_s / 10))

    def measure(workers, processes, queue):
        if model is not None:
            with FastLoader(dataset, workers=workers, use_multiprocessing=processes,
                            max_queue_size=queue) as loader:
                return fit_timing.steps_per_s(model, loader, warmup=max(2, queue), seconds=burst)
        return measure_loader(dataset, workers, processes, queue, seconds=burst)

    with fit_timing.state_kept(model) if model is not None else contextlib.nullcontext():
        result = _search(measure, max_workers, target=target_batches_per_s, budget_s=budget_s, progress=progress)
    tune_cache.store(key, result.to_dict())
    return result
