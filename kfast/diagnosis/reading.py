"""The input phase of `kfast.diagnose` and the dataset's own state: batches read with no training, no more
passes than the phase needs, batches that change between passes noticed, and attributes the dataset
rebinds while serving put back.

NOTE [ Putting the dataset back ]: some datasets change themselves while they serve (a `__getitem__`
that shrinks `self.batch_size` for the last, partial batch, a counter, a shuffled `self.indices`). Read
for several passes, such a dataset serves other batches in the second pass than in the first, and keeps
serving them to `tune` and to training afterwards. `DatasetGuard` takes a shallow copy of the instance's
`__dict__` before diagnose reads anything and, between passes, between phases and at the end, rebinds
every attribute whose value was replaced, naming it in the report. Shallow on purpose: a deep copy would
duplicate arrays, open files and locks. What it cannot undo is a change made inside an object the
attributes still point at (`self.indices.sort()`); the batch shapes compared across passes still show its
effect. Attributes that were `None` before and attributes added while serving are left as they are: they
are usually a lazily opened resource (a file, a decoder, a pool), and dropping it would leak or reopen it.
A FastLoader keeps its own state (its pool): only the dataset it wraps is put back, and only between
phases, since its workers read ahead across epochs. A `tf.data.Dataset` is not Python state: it is left
alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kfast._core import fit_timing
from kfast._core.tf_datasets import is_tf_dataset
from kfast.data import structure

_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _same(a: Any, b: Any) -> bool:
    """Whether an attribute still holds what it held: the same object, or an equal plain value."""
    return a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b)


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, _PLAIN) else f"a new {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def is_loader(data: Any) -> bool:
    """A kfast FastLoader (it counts the time its callers wait), whose iteration is its prefetched stream."""
    return hasattr(data, "wait_seconds") and hasattr(data, "settings")


class DatasetGuard:
    """Remembers a dataset's attributes and puts back the ones it replaces while serving (see the NOTE).

    Args:
        data: what diagnose reads: a PyDataset-like object, a FastLoader (its `dataset` is guarded) or
            anything else (a `tf.data.Dataset`, an iterator: nothing is guarded).

    Example:

    >>> class Shrinks:
    ...     def __init__(self):
    ...         self.batch_size = 32
    ...     def __getitem__(self, i):
    ...         self.batch_size = 4
    ...         return i
    >>> data = Shrinks()
    >>> guard = DatasetGuard(data)
    >>> _ = data[0]
    >>> guard.restore(), data.batch_size
    (['batch_size'], 32)
    >>> guard.notes()
    ['Shrinks rebinds batch_size (32 -> 4) while serving; diagnose put it back after each pass and at the end']
    """

    def __init__(self, data: Any) -> None:
        target = getattr(data, "dataset", None) if is_loader(data) else data
        state = getattr(target, "__dict__", None)
        guard = target is not None and isinstance(state, dict) and not is_tf_dataset(target)
        self.target = target if guard else None
        # Between epochs inside fit too, unless a FastLoader's workers may be reading ahead from it.
        self.inside_fit = guard and target is data
        self.saved: dict[str, Any] = dict(state) if guard and isinstance(state, dict) else {}
        self.changed: dict[str, tuple[Any, Any]] = {}

    def restore(self) -> list[str]:
        """Rebinds the attributes replaced since the guard was made; returns their names (none: `[]`)."""
        if self.target is None:
            return []
        state = vars(self.target)
        names = [k for k, v in self.saved.items() if v is not None and k in state and not _same(state[k], v)]
        for name in names:
            self.changed.setdefault(name, (self.saved[name], state[name]))
            state[name] = self.saved[name]
        return names

    def notes(self) -> list[str]:
        """Sentences for the report: what the dataset rebound while serving."""
        if not self.changed:
            return []
        what = ", ".join(f"{k} ({_short(a)} -> {_short(b)})" for k, (a, b) in self.changed.items())
        names = "them" if len(self.changed) > 1 else "it"
        return [f"{type(self.target).__name__} rebinds {what} while serving; diagnose put {names} back after each "
                "pass and at the end"]

    def callback(self) -> keras.callbacks.Callback | None:
        """A callback that puts the attributes back at the end of every epoch of fit, or `None` where that
        is not safe (a FastLoader) or not needed."""
        return _PutBack(self) if self.inside_fit else None


class _PutBack(keras.callbacks.Callback):
    def __init__(self, guard: DatasetGuard) -> None:
        super().__init__()
        self.guard = guard

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.guard.restore()


def _shapes(batch: Any) -> tuple[Any, tuple[tuple[int, ...], ...]]:
    spec, leaves = structure.flatten(batch)
    return spec, tuple(tuple(int(d) for d in np.shape(leaf)) for leaf in leaves)


def _passes(data: Any) -> Iterator[Iterator[Any]]:
    """One iterator of batches per pass over `data`, for as many passes as the caller asks."""
    indexable = hasattr(data, "__getitem__") and hasattr(data, "__len__") and not is_loader(data)
    while True:
        yield (data[i] for i in range(len(data))) if indexable else iter(data)


class InputRead:
    """What the input phase read: the first batch, each timed batch's seconds, and what it noticed."""

    def __init__(self) -> None:
        self.first: Any = None
        self.seconds: list[float] = []
        self.passes = 0
        self.notes: list[str] = []


def read_input(data: Any, *, warmup: int, steps: int, least: int, deadline: float, guard: DatasetGuard) -> InputRead:
    """Reads batches with no training: `warmup` untimed, then up to `steps` timed, stopping at `deadline`
    once `least` are timed; a short dataset is read for the passes that takes and no more. Each pass's
    batch shapes are compared with the first pass's, position by position, and the guard puts the dataset's
    attributes back after every pass.

    Raises:
        ValueError: for data that yields no batches when iterated again (a one-shot iterator).
    """
    out = InputRead()
    length = fit_timing.batches_per_epoch(data)
    seen: list[Any] = []
    changed: list[str] = []
    read, stamp = 0, time.perf_counter()
    for one_pass in _passes(data):
        out.passes += 1
        position = -1
        for position, batch in enumerate(one_pass):
            now = time.perf_counter()
            if read >= warmup:
                out.seconds.append(now - stamp)
            stamp, read = now, read + 1
            out.first = batch if out.first is None else out.first
            shapes = _shapes(batch)
            if out.passes == 1:
                seen.append(shapes)
            elif position < len(seen) and shapes != seen[position] and len(changed) < 3:
                changed.append(f"batch {position}: {seen[position][1]} in pass 1, {shapes[1]} in pass {out.passes}")
            timed = len(out.seconds)
            if timed >= steps or (timed >= least and now >= deadline):
                break
        else:
            if position < 0:
                if out.passes == 1:
                    raise ValueError(f"diagnose got {type(data).__name__} with no batches; pass the data you train on.")
                raise ValueError(f"diagnose got {type(data).__name__} that yields no batches when iterated again; pass "
                                 "data that can be read more than once (a keras.utils.PyDataset or a tf.data.Dataset).")
            guard.restore()
            if length is not None and fit_timing.batches_per_epoch(data) != length:
                out.notes.append(f"{type(data).__name__} had {length} batches before diagnose read it and "
                                 f"{fit_timing.batches_per_epoch(data)} after pass {out.passes}")
            stamp = time.perf_counter()  # the next pass's set-up (a new iterator) is not a batch's load time
            continue
        break
    if changed:
        out.notes.append(f"{type(data).__name__}'s batches change between passes (shapes of the same batch: "
                         f"{'; '.join(changed)}): training for several epochs sees the changed batches too")
    return out
