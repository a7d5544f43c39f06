"""`kfast.tune` for a `tf.data.Dataset`: the pipeline's options, the prefetch depth appended to it and
`cache()`, chosen by measurement (`kfast.tune` hands a `tf.data.Dataset` here).

NOTE [ How a tf.data pipeline is tuned ]
The pipeline is already built, so only what acts on a built pipeline can change: `tf.data.Options`
(deterministic, map_parallelization, private_threadpool_size, max_intra_op_parallelism), a `prefetch`
appended at the end, and a `cache()` appended at the end. One knob at a time, in that order after the
cache, each value is tried on top of the best so far and kept when it is 5% faster (less is within a
burst's noise). The pipeline as given is the first trial; when something else won, the two are measured
again, twice each (given, chosen, chosen, given), and the pipeline as given wins unless the choice's
better burst is at least as fast as its own, so `tune` never hands back a slower pipeline by its own
measure. Every trial is measured the same way: two batches (or training steps: the first traces the step)
of warm-up, then a burst of a sixteenth of the budget (0.2 to 2 s).

`cache()` freezes the first epoch: it is safe only when every epoch yields the same batches in the same
order. It is offered only when two passes give the same first `CHECK_BATCHES` batches, byte for byte
(a shuffle, a random augmentation or a non-deterministic order makes them differ), when tf.data knows the
epoch's length, when the epoch's bytes (estimated from those batches) fit in `MEMORY_SHARE` of the memory
available, and when filling it (one epoch) takes at most a quarter of the budget. The cache is made and
filled once, before its trials, and shared by all of them, so a cached trial measures reading a full
cache, as every epoch after the first will.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import psutil

from kfast._core import fit_timing
from kfast._core.checks import check_int, check_number
from kfast._core.cpus import usable_cpus
from kfast.tuning.tf_data_result import TfDataTuneResult
from kfast.tuning.tf_data_settings import AUTOTUNE
from kfast.tuning.tf_data_settings import TfDataSettings

CHECK_BATCHES = 3
MEMORY_SHARE = 0.25
_BETTER = 1.05
_CHECKS = 4  # the final check's bursts
_INFINITE, _UNKNOWN = -1, -2  # tf.data.INFINITE_CARDINALITY, tf.data.UNKNOWN_CARDINALITY


def _first_batches(dataset: Any, count: int) -> list[list[np.ndarray]]:
    import tensorflow as tf

    return [[np.asarray(t) for t in tf.nest.flatten(batch, expand_composites=True)] for batch in dataset.take(count)]


def _same(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    def leaf_same(x: np.ndarray, y: np.ndarray) -> bool:
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        return x.tolist() == y.tolist() if x.dtype == object else x.tobytes() == y.tobytes()

    return len(a) == len(b) and all(len(p) == len(q) and all(map(leaf_same, p, q)) for p, q in zip(a, b))


def _nbytes(batch: list[np.ndarray]) -> int:
    return sum(sum(len(v) for v in leaf.ravel()) if leaf.dtype == object else leaf.nbytes for leaf in batch)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def cache_verdict(dataset: Any, budget_s: float) -> tuple[bool, str]:
    """Whether `cache()` may be tried on `dataset` within `budget_s`, and why (or why not), in words.

    Example:

    >>> import tensorflow as tf
    >>> cache_verdict(tf.data.Dataset.range(8).batch(2), budget_s=10)[0]
    True
    >>> print(cache_verdict(tf.data.Dataset.range(8).shuffle(8).batch(2), budget_s=10)[1])  # doctest: +ELLIPSIS
    not tried: two passes gave different batches (a shuffle, a random augmentation or a non-deterministic ...
    """
    length = int(dataset.cardinality())
    if length == _INFINITE:
        return False, "not tried: the pipeline repeats for ever; cache() belongs before its repeat()."
    if length == _UNKNOWN:
        return False, ("not tried: tf.data does not know the epoch's length (after a filter or from_generator), so "
                       "its size cannot be estimated; dataset.apply(tf.data.experimental.assert_cardinality(n)) "
                       "tells it.")
    start = time.perf_counter()
    first = _first_batches(dataset, CHECK_BATCHES)
    seconds = time.perf_counter() - start
    if not _same(first, _first_batches(dataset, CHECK_BATCHES)):
        return False, ("not tried: two passes gave different batches (a shuffle, a random augmentation or a "
                       "non-deterministic order), and a cache would train every epoch on the first one's.")
    epoch_bytes = length * sum(map(_nbytes, first)) / max(1, len(first))
    available = psutil.virtual_memory().available
    if epoch_bytes > MEMORY_SHARE * available:
        return False, (f"not tried: an epoch is about {_size(epoch_bytes)}, more than {MEMORY_SHARE:.0%} of the "
                       f"{_size(available)} of memory available.")
    fill_s = seconds / max(1, len(first)) * length
    if fill_s > budget_s / 4:
        return False, (f"not tried: filling it reads one epoch, about {fill_s:.1f} s, more than a quarter of "
                       f"budget_s={budget_s:g}; a larger budget_s tries it.")
    return True, (f"tried: two passes gave the same first {len(first)} batches, and an epoch of about "
                  f"{_size(epoch_bytes)} fits in {MEMORY_SHARE:.0%} of the {_size(available)} of memory available.")


def read_rate(dataset: Any, *, warmup: int = 2, seconds: float = 1.0) -> float:
    """Batches/s of reading `dataset` alone, epoch after epoch, after `warmup` batches, for about `seconds`.

    Example:

    >>> import tensorflow as tf
    >>> read_rate(tf.data.Dataset.range(8).batch(2), seconds=0.05) > 0
    True
    """
    stream = iter(())

    def next_batch() -> None:
        nonlocal stream
        try:
            next(stream)
        except StopIteration:
            stream = iter(dataset)
            next(stream)

    for _ in range(warmup):
        next_batch()
    done, start = 0, time.perf_counter()
    while done < 3 or time.perf_counter() - start < seconds:
        next_batch()
        done += 1
    return done / (time.perf_counter() - start)


def fit_rate(model: keras.Model, dataset: Any, *, warmup: int = 2, seconds: float = 1.0) -> float:
    """Training steps/s of compiled `model` fed by `dataset`, through `fit` (`fit_timing.timed_fit`)."""
    length = int(dataset.cardinality())
    if length == _UNKNOWN:
        dataset = dataset.repeat()  # else fit would run out of data before the clock stops it
    most = warmup + (20 * length if length > 0 else 100_000)
    clock = _quiet_fit(model, dataset, fit_timing.StepClock(most, warmup=warmup, seconds=seconds))
    return clock.rate()


def _quiet_fit(model: keras.Model, dataset: Any, clock: fit_timing.StepClock) -> fit_timing.StepClock:
    with warnings.catch_warnings():
        # fit's default shuffle=True does not apply to a tf.data.Dataset, and Keras says so each time.
        warnings.filterwarnings("ignore", message="`shuffle=True` was passed", category=UserWarning)
        return fit_timing.timed_fit(model, dataset, clock)


def stages(dataset: Any, *, cache: bool, max_workers: int) -> list[tuple[str, list[Any]]]:
    """The knobs to try, in order, each with the values that differ from the pipeline's own."""
    options = dataset.options()
    cpus = usable_cpus()
    pool = options.threading.private_threadpool_size
    intra = options.threading.max_intra_op_parallelism
    found: list[tuple[str, list[Any]]] = [("cache", [True])] if cache else []
    found.append(("prefetch", [AUTOTUNE, 2, 8]))
    if options.deterministic is not False:
        found.append(("deterministic", [False]))
    found.append(("map_parallelization", [options.experimental_optimization.map_parallelization is False]))
    pools = sorted({min(n, max_workers) for n in (cpus, 2 * cpus)} - {pool})
    if pools:
        found.append(("private_threadpool_size", pools))
    if cpus > 1 and intra != cpus:
        found.append(("max_intra_op_parallelism", [cpus]))
    return found


_Outcome = tuple[TfDataSettings, float, float, list[dict[str, Any]]]


def search(measure: Callable[[TfDataSettings], float], knobs: list[tuple[str, list[Any]]], *, budget_s: float,
           target: float | None = None, clock: Callable[[], float] = time.monotonic,
           progress: Callable[[dict[str, Any]], None] | None = None) -> _Outcome:
    """Runs the search with `measure(settings) -> batches/s`; returns (chosen settings, its rate, the rate
    of the pipeline as given, trials). `tune` passes real bursts, tests pass scripted rates and clocks."""
    trials: list[dict[str, Any]] = []
    start = clock()
    cost = 0.0

    def trial(settings: TfDataSettings, kind: str) -> float:
        nonlocal cost
        began = clock()
        rate = measure(settings)
        cost = clock() - began
        trials.append({**settings.to_dict(), "batches_per_s": rate, "trial": kind})
        if progress:
            progress(trials[-1])
        return rate

    given = TfDataSettings()
    best, best_rate = given, trial(given, "given")
    given_rate = best_rate
    for knob, values in knobs:
        for value in values:
            # Room for this trial and the final check.
            if (target is not None and best_rate >= target) or clock() - start + (1 + _CHECKS) * cost > budget_s:
                break
            candidate = best.replace(**{knob: value})
            rate = trial(candidate, "tried")
            if rate > best_rate * _BETTER:
                best, best_rate = candidate, rate
    if best != given:
        # Given, chosen, chosen, given: a drift in the machine's load falls on both alike, and the better
        # burst of each is the one that other processes disturbed least.
        rates = [trial(settings, "check") for settings in (given, best, best, given)]
        given_rate, best_rate = max(rates[0], rates[3]), max(rates[1], rates[2])
        if best_rate < given_rate:
            best, best_rate = given, given_rate
    return best, best_rate, given_rate, trials


def tune_tf_data(dataset: Any, *, model: keras.Model | None = None, budget_s: float = 30,
                 max_workers: int | None = None, target_batches_per_s: float | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> TfDataTuneResult:
    """`kfast.tune` for a `tf.data.Dataset` (see `kfast.tune` for the arguments and the NOTE above for how).

    Example:

    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.range(32).map(lambda i: (tf.cast(i, "float32"), i % 2)).batch(8)
    >>> result = tune_tf_data(ds, budget_s=1)
    >>> result.speedup >= 1.0
    True
    >>> sorted(int(y) for _, ys in result.loader(ds) for y in ys) == sorted(i % 2 for i in range(32))
    True
    """
    check_number("tune", "budget_s", budget_s, above=0, unit="seconds", hint="e.g. budget_s=30")
    check_int("tune", "max_workers", max_workers, or_none=f"for twice the usable CPU cores ({2 * usable_cpus()})")
    if model is not None:
        fit_timing.build_if_needed("tune", model, dataset)  # a subclassed model is built as fit would
    began = time.monotonic()
    can_cache, note = cache_verdict(dataset, budget_s)
    cached = None
    if can_cache:
        cached = dataset.cache()
        for _ in cached:  # filled once here, read by every cached trial
            pass
    burst = max(0.2, min(2.0, budget_s / 16))

    def measure(settings: TfDataSettings) -> float:
        base = cached if settings.cache and cached is not None else dataset
        trial_ds = settings.replace(cache=False).apply(base)
        if model is None:
            return read_rate(trial_ds, seconds=burst)
        return fit_rate(model, trial_ds, seconds=burst)

    knobs = stages(dataset, cache=can_cache, max_workers=max_workers or 2 * usable_cpus())
    with fit_timing.state_kept(model) if model is not None else contextlib.nullcontext():
        if model is not None:
            # One step traces fit's step now, so that the first trial's time says what a trial costs.
            _quiet_fit(model, dataset.take(1), fit_timing.StepClock(1))
        chosen, rate, given_rate, trials = search(measure, knobs, budget_s=budget_s - (time.monotonic() - began),
                                                  target=target_batches_per_s, progress=progress)
    return TfDataTuneResult(chosen, rate, given_rate, trials, note, "pipeline" if model is None else "fit",
                            chosen.apply(dataset))
