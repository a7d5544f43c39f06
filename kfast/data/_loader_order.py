"""The order a FastLoader serves its batches in: its shard of the dataset, each epoch's permutation, and an
epoch resumed from a saved state (see `NOTE [ The data position ]` in `kfast.data.position`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kfast.data import position
from kfast.data._shard_checks import check_enough
from kfast.data.position import EpochOrder
from kfast.data.sharding import ShardedDataset


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """What one iteration of the loader serves: its epoch, whether permuted, where it starts, and the dataset
    indices of its positions `start`, `start + 1`, ... (a resumed epoch keeps the order it was recorded in)."""

    epoch: int
    shuffled: bool
    start: int
    indices: tuple[int, ...]
    resumed: EpochOrder | None = None  # the recorded order this plan goes on from


class LoaderOrder:
    """Maps a loader's epochs to the dataset indices it asks its workers for.

    With `rank`/`size` the loader shards the dataset itself: rank r of R serves batches r, r + R, ... in an
    order permuted per epoch by (seed, epoch) (`n = total // R` each, the rest left out, as
    `ShardedDataset`'s "drop"). A `ShardedDataset` passed in keeps its own layout.
    """

    def __init__(self, dataset: Any, total: int, rank: int, size: int, seed: int) -> None:
        if isinstance(dataset, ShardedDataset):
            self.sharded, self.rank, self.size, self.total = position.GIVEN, dataset.rank, dataset.size, total
            self.n = total
        else:
            if size > 1:
                check_enough("FastLoader", total, size)
            self.sharded, self.rank, self.size, self.total = position.OWN, rank, size, total
            self.n = total // size
        self.seed = seed

    def dataset_index(self, local: int) -> int:
        """The dataset index of this rank's batch `local` (0 <= local < n)."""
        return self.rank + self.size * local if self.sharded == position.OWN else local

    def plan(self, epoch: int, shuffled: bool) -> EpochPlan:
        """The whole of epoch `epoch`, from its first batch."""
        local = np.random.default_rng([self.seed, epoch]).permutation(self.n) if shuffled else np.arange(self.n)
        return EpochPlan(epoch, shuffled, 0, tuple(self.dataset_index(int(i)) for i in local))

    def resume(self, order: EpochOrder) -> EpochPlan:
        """The rest of the recorded epoch `order` that this rank serves (on any number of ranks, see
        `EpochOrder.remaining`); the loader's seed becomes this rank's recorded one."""
        batches = order.remaining(self.rank, self.size)
        if self.rank < len(order.seeds):
            self.seed = order.seeds[self.rank]
        indices = tuple(batches) if self.sharded == position.OWN else tuple(self.dataset_index(i) for i in batches)
        return EpochPlan(order.epoch, order.shuffled, self.n - len(batches), indices, order)

    def view(self, plan: EpochPlan, served: int) -> EpochOrder:
        """This rank's view of `plan`'s epoch, `served` of its batches trained (see `merge`)."""
        if plan.resumed is not None:
            return plan.resumed.advanced(served, self.size)
        return EpochOrder((self.seed,), self.size, plan.epoch, plan.shuffled, self.total, self.sharded,
                          served * self.size)

    def next_view(self, epoch: int, shuffled: bool) -> EpochOrder:
        """The view of epoch `epoch` before any of it is trained."""
        return EpochOrder((self.seed,), self.size, epoch, shuffled, self.total, self.sharded)


def merge(views: list[EpochOrder]) -> EpochOrder:
    """The epoch order of every rank from each rank's `view` (in rank order): a resumed order is complete
    on every rank already; a fresh one has each rank's own seed."""
    first = views[0]
    if len(first.seeds) == first.size:
        return first
    return dataclasses.replace(first, seeds=tuple(v.seeds[0] for v in views))
