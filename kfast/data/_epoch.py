"""One epoch of a FastLoader's batches: what `iter(loader)` returns, holding that epoch's moving parts.

The loader holds settings, its order and the worker pool (`kfast.data._stream`); each iteration is an
`EpochIterator` of its own, as PyTorch's `DataLoader` hands out a new `_MultiProcessingDataLoaderIter` per
`iter()`. A newer iteration of the same loader makes an unfinished older one stale: its tasks are dropped,
and using it again is an error (one loader feeds one loop at a time).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import deque
from typing import Any

from kfast.data._loader_args import overrides
from kfast.data._loader_order import EpochPlan


@dataclasses.dataclass
class Ahead:
    """Batches of the next epoch loaded while `after` ended (adopted by the next iteration if it is `plan`)."""

    after: weakref.ref[EpochIterator]  # not a strong reference: dropping an iteration ends it (see __del__)
    plan: EpochPlan
    seqs: list[int]


class EpochIterator:
    """The batches of one epoch of a FastLoader, in its order; made by `iter(loader)`.

    Args:
        loader: the FastLoader.
        plan: the epoch: its number, whether it is permuted, where it starts and the dataset indices.
        adopted: sequence numbers of tasks already dispatched for the plan's first positions (loaded ahead
            while the epoch before ended).
        generation: the pool generation those tasks belong to.
    """

    def __init__(self, loader: Any, plan: EpochPlan, adopted: list[int], generation: int) -> None:
        self._loader, self.plan = loader, plan
        self._pending: deque[int] = deque(adopted)
        self._next = len(adopted)  # positions of plan.indices dispatched
        self._generation = generation
        self.served = 0
        self.began = self.finished = self.stale = False

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        """Batches still to come in this epoch."""
        return len(self.plan.indices) - self.served

    @property
    def done(self) -> bool:
        """Whether every batch of the epoch was handed out."""
        return self.served >= len(self.plan.indices)

    def __next__(self) -> Any:
        loader = self._loader
        with loader._lock:
            if self.stale:
                raise RuntimeError(
                    "This iteration of a FastLoader was replaced by a newer iter(loader) before it finished; a loader "
                    "feeds one loop at a time. Make a second FastLoader to read the same data in two loops at once.")
            if not self.began:
                self.began = True
                loader._epoch_begins(self)
            if self.done:
                self.finish()
                raise StopIteration
            stream = loader._stream
            if self._generation != stream.generation:
                # The pool was closed (a failure, configure()): the tasks in flight are gone; dispatch again.
                self._pending.clear()
                self._next, self._generation = self.served, stream.generation
            at = self.served
            try:
                self._fill()
                batch = stream.result(self._pending.popleft(), lambda: self.plan.indices[at])
            except BaseException:
                if not stream.interrupted:
                    # The batch that failed is done with: the next call goes on to the one after it, as
                    # PyTorch's DataLoader does, so a loop that skips bad batches ends with the epoch.
                    self.served += 1
                raise
            self.served += 1
            try:
                self._fill()
            except Exception:  # noqa: BLE001 - the pool is closed; the next call meets the failure itself
                pass
            return batch

    def __del__(self) -> None:
        # An iteration dropped before its end ends its workers at once (PyTorch's DataLoader does the same);
        # the next one starts them again.
        if not (self.finished or self.stale):
            try:
                self._loader._dropped(self)
            except Exception:  # noqa: BLE001 - at interpreter exit the pool may be half gone; nothing to end then
                pass

    def _fill(self) -> None:
        loader, stream, indices = self._loader, self._loader._stream, self.plan.indices
        window = loader._in_flight
        while len(self._pending) < window and self._next < len(indices):
            self._pending.append(stream.submit(indices[self._next], self.plan.epoch))
            self._next += 1
        self._generation = stream.generation
        if self._next == len(indices):
            load_ahead(loader, self, window - len(self._pending))

    def finish(self) -> None:
        """Ends the epoch (the dataset's `on_epoch_end` runs), once."""
        if not (self.finished or self.stale):
            self.finished = True
            self._loader._epoch_ends(self)


def load_ahead(loader: Any, it: EpochIterator, room: int) -> None:
    """Loads the next epoch's first batches while `it` ends, when nothing at the boundary needs the workers
    idle: no epoch hooks to run, no thread-shared dataset to move to the next epoch, no loaded position."""
    dataset = loader.dataset
    if room <= 0 or loader._cursor.resume is not None or it is not loader._current \
            or overrides(dataset, "on_epoch_end") or overrides(dataset, "on_epoch_begin") \
            or (not loader.settings.use_multiprocessing and hasattr(dataset, "set_epoch")):
        return
    ahead = loader._ahead
    if ahead is None or ahead.after() is not it:
        plan = loader._order.plan(loader._cursor.next_epoch, it.plan.shuffled)
        ahead = loader._ahead = Ahead(weakref.ref(it), plan, [])
    while len(ahead.seqs) < min(room, len(ahead.plan.indices)):
        ahead.seqs.append(loader._stream.submit(ahead.plan.indices[len(ahead.seqs)], ahead.plan.epoch))
