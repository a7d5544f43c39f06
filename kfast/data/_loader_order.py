"""The order a FastLoader serves its batches in: its shard of the dataset, each epoch's permutation, and an
epoch resumed from a checkpoint (see `NOTE [ The data position ]` in `kfast.data.position`)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from kfast.data import position
from kfast.data._shard_checks import check_enough
from kfast.data.position import EpochOrder
from kfast.data.sharding import ShardedDataset


@dataclasses.dataclass(frozen=True)
class _Resumed:
    order: EpochOrder  # the recorded order, as taken
    start: int  # the first position of the loader's epoch served from `batches`
    batches: list[int]


class LoaderOrder:
    """Maps (epoch, position) to the dataset index a FastLoader asks its workers for.

    With `rank`/`size` the loader shards the dataset itself: rank r of R serves batches r, r + R, ... in an
    order permuted per epoch (`n = total // R` each, the rest left out, as `ShardedDataset`'s "drop").
    A `ShardedDataset` passed in keeps its own layout.
    """

    def __init__(self, dataset: Any, total: int, rank: int, size: int, seed: int, seed_given: bool) -> None:
        if isinstance(dataset, ShardedDataset):
            self.sharded, self.rank, self.size, self.total = position.GIVEN, dataset.rank, dataset.size, total
            self.n = total
        else:
            if size > 1:
                check_enough("FastLoader", total, size)
            self.sharded, self.rank, self.size, self.total = position.OWN, rank, size, total
            self.n = total // size
        self.seed, self.seed_given = seed, seed_given
        self.shuffling = False  # the order batches are dispatched in now (see kfast.data._keras_order)
        self._orders: dict[int, np.ndarray] = {}
        self.resumed: _Resumed | None = None

    def index(self, epoch: int, at: int) -> int:
        """The dataset index of position `at` of the loader's epoch `epoch`."""
        resumed = self.resumed
        if resumed is not None and epoch == resumed.order.epoch and at >= resumed.start:
            return resumed.batches[at - resumed.start]
        local = at
        if self.shuffling:
            if epoch not in self._orders:
                if len(self._orders) > 2:
                    self._orders.pop(min(self._orders))
                self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            local = int(self._orders[epoch][at])
        return self.rank + self.size * local if self.sharded == position.OWN else local

    def take_offer(self) -> int | None:
        """Takes a recorded order offered by `restore()` when it is this loader's: returns the absolute
        position (epoch * n + first position) the loader goes on from, or None."""
        if position.pending() is None:
            return None
        order = position.take(self.total, self.sharded)
        if order is None:
            return None
        batches = order.remaining(self.rank, self.size)
        if self.rank < len(order.seeds):
            recorded = order.seeds[self.rank]
            if self.seed_given and recorded != self.seed:
                warnings.warn(f"FastLoader got seed={self.seed}, but the checkpoint it resumes from was trained with "
                              f"seed={recorded}; it follows the checkpoint, so that the run goes on in the order it "
                              "would have had without the interruption.", stacklevel=4)
            self.seed = recorded
            self._orders.clear()
        self.shuffling = order.shuffled
        start = self.n - len(batches)
        self.resumed = _Resumed(order, start, batches)
        return order.epoch * self.n + start

    def view(self, epoch: int, trained: int, finished: bool) -> EpochOrder:
        """This rank's view of the order of its epoch `epoch`, `trained` steps in (see `merge`)."""
        if finished:
            return EpochOrder((self.seed,), self.size, epoch + 1, self.shuffling, self.total, self.sharded)
        resumed = self.resumed
        if resumed is not None and resumed.order.epoch == epoch:
            return resumed.order.advanced(trained, self.size)
        return EpochOrder((self.seed,), self.size, epoch, self.shuffling, self.total, self.sharded, trained * self.size)


def merge(views: list[EpochOrder]) -> EpochOrder:
    """The epoch order of every rank from each rank's `view` (in rank order): a resumed order is complete
    on every rank already; a fresh one has each rank's own seed."""
    first = views[0]
    if len(first.seeds) == first.size:
        return first
    return dataclasses.replace(first, seeds=tuple(v.seeds[0] for v in views))
