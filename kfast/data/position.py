"""Where a FastLoader is in an epoch, so that a checkpoint can resume training inside it.

NOTE [ The data position ]
A FastLoader's order within an epoch is a function of a few numbers, never of what happened before: its
seed, its own epoch number `e` (the order's permutation is seeded by (seed, e)), and whether the epoch is
shuffled. With the loader's own sharding (every FastLoader under Horovod, and the one rank of a single
process), rank r of R serves at step s the batch `r + R * perm_r[s]` of the dataset: each rank a fixed
shard, permuted by its own seed. The epoch's global order interleaves the ranks step by step,
`G[s * R + r]`, so that after k steps on every rank its first `k * R` positions are trained, whatever the
ranks did in between.

A checkpoint records an `EpochOrder`: the seeds of all R ranks, R, e, shuffled, the dataset's length,
and `done`, the positions of G already trained. A run resumed on R' ranks serves the rest, `G[done:]`,
dealt round-robin, as many per rank as every rank gets (so each step still pairs up): with R' == R each
rank gets exactly the batches it would have trained next, in the same order. The next epochs go on with
each rank's recorded seed. A user's own `ShardedDataset` keeps its layout: it resumes on the same R only.

Who holds it: the loader itself. `FastLoader.state_dict()` returns its position as a versioned dict (an
`EpochOrder` of its own rank, `STATE_VERSION`), and `FastLoader.load_state_dict(state)` makes its next
iteration start there. `RankZeroCheckpoint(loader=...)` gathers every rank's state into one complete
`EpochOrder` for the checkpoint file, and `kfast.distributed.restore(model, directory, loader=...)` hands
it back to the loader given. Nothing is kept in this module: there is no offer for "the next loader".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# How a loader's dataset is split over ranks: by the loader itself, or by a ShardedDataset of the user's.
OWN, GIVEN = "loader", "given"

# The version of `FastLoader.state_dict()`'s form; a later release reads older versions or refuses them clearly.
STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """One epoch's batch order over every rank, and how much of it is trained (see the NOTE above).

    Attributes:
        seeds: the order seed of each rank of the layout that defined the order.
        size: the ranks of that layout.
        epoch: the loader's own epoch number (it seeds the permutation).
        shuffled: whether the epoch is permuted (else index order).
        total: batches in the dataset the loaders read (a `ShardedDataset`: batches in the shard).
        sharded: `"loader"` (the loader's own sharding) or `"given"` (a `ShardedDataset` of the user's).
        done: positions of the global order already trained.
        dataset_state: the dataset's own `state_dict()` when it has one (a `PackedDataset`'s seed), rank 0's.
    """

    seeds: tuple[int, ...]
    size: int
    epoch: int
    shuffled: bool
    total: int
    sharded: str
    done: int = 0
    dataset_state: Any = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form a checkpoint stores."""
        return {**dataclasses.asdict(self), "seeds": list(self.seeds)}

    @classmethod
    def from_dict(cls, value: Any) -> EpochOrder | None:
        """The order stored by `as_dict`, or None for anything else (an older checkpoint)."""
        try:
            order = cls(tuple(int(s) for s in value["seeds"]), int(value["size"]), int(value["epoch"]),
                        bool(value["shuffled"]), int(value["total"]), str(value["sharded"]), int(value["done"]),
                        value.get("dataset_state"))
        except (TypeError, KeyError, ValueError):
            return None
        return order if len(order.seeds) == order.size and order.sharded in (OWN, GIVEN) else None

    def local_length(self, rank: int, size: int) -> int:
        """Batches per epoch of rank `rank` of `size` under this layout."""
        return self.total // size if self.sharded == OWN else self.total

    def _permutation(self, rank: int) -> np.ndarray:
        n = self.local_length(rank, self.size)
        if not self.shuffled:
            return np.arange(n)
        return np.random.default_rng([self.seeds[rank], self.epoch]).permutation(n)

    def remaining(self, rank: int, size: int) -> list[int]:
        """The batches (dataset indices, or shard indices for a given shard) that rank `rank` of `size` serves
        to finish the epoch.

        Raises:
            ValueError: for a user's `ShardedDataset` resumed on another number of ranks.
        """
        if self.sharded == GIVEN:
            if size != self.size:
                raise ValueError(
                    f"This checkpoint's loader read a ShardedDataset of the user's over {self.size} rank(s); it "
                    f"cannot be resumed inside its epoch on {size} rank(s). Resume on {self.size} rank(s), or "
                    "let FastLoader shard the dataset itself (pass the whole dataset), which resumes on any number.")
            return [int(i) for i in self._permutation(rank)[self.done // self.size:]]
        n = self.local_length(0, self.size)
        steps = np.stack([r + self.size * self._permutation(r) for r in range(self.size)], axis=1)
        rest = steps.reshape(-1)[self.done:]  # step-major: the global order G
        each = len(rest) // size
        return [int(i) for i in rest[rank::size][:each]] if n else []

    def advanced(self, steps: int, size: int) -> EpochOrder:
        """This order after `steps` more steps on each of `size` ranks."""
        return dataclasses.replace(self, done=self.done + steps * size)


def state_of(order: EpochOrder, rank: int) -> dict[str, Any]:
    """`FastLoader.state_dict()`'s form of `order`, as rank `rank` of its layout sees it."""
    complete = len(order.seeds) == order.size
    return {"version": STATE_VERSION, "epoch": order.epoch, "batches_done": order.done // order.size,
            "seed": order.seeds[rank if complete else 0], "seeds": list(order.seeds) if complete else None,
            "shuffle": order.shuffled, "rank": rank, "size": order.size, "length": order.total,
            "sharding": order.sharded, **({"dataset": order.dataset_state} if order.dataset_state is not None else {})}


def order_of(state: Any, rank: int, size: int, owner: str = "FastLoader.load_state_dict") -> EpochOrder:
    """The `EpochOrder` a state from `state_of` (or a checkpoint's merged one) describes, checked for a loader
    that is rank `rank` of `size`.

    Raises:
        ValueError: for a state that is not one, of another version, or one rank's state loaded by another
            rank of the same job size or a job of another size (only a checkpoint's merged state, holding every
            rank's seed, resumes on any number of ranks).
    """
    if not isinstance(state, dict) or "version" not in state:
        raise ValueError(f"{owner} got {type(state).__name__} {str(state)[:80]!r}; it takes the dict that "
                         "FastLoader.state_dict() returns.")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"{owner} got a state of version {state['version']!r}; this kfast reads version "
                         f"{STATE_VERSION}. Save it again with this kfast, or load it with the kfast that wrote it.")
    try:
        seeds = state["seeds"]
        recorded = int(state["size"])
        if seeds is None:
            if recorded > 1 and (int(state["rank"]), recorded) != (rank, size):
                raise ValueError(
                    f"{owner} got the state of rank {state['rank']} of {recorded}, holding that rank's seed only, "
                    f"for rank {rank} of {size}. Load each rank's own state, or the merged state a "
                    "RankZeroCheckpoint writes (every rank's seed), which resumes on any number of ranks.")
            # The other ranks' seeds never matter to this rank on the same layout (see the NOTE above).
            seeds = [int(state["seed"])] * recorded
        order = EpochOrder(tuple(int(s) for s in seeds), recorded, int(state["epoch"]), bool(state["shuffle"]),
                           int(state["length"]), str(state["sharding"]), int(state["batches_done"]) * recorded,
                           state.get("dataset"))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{owner} got a state without a readable {e}; it takes the dict that "
                         "FastLoader.state_dict() returns.") from None
    if len(order.seeds) != order.size or order.sharded not in (OWN, GIVEN):
        raise ValueError(f"{owner} got an inconsistent state ({len(order.seeds)} seeds for {order.size} ranks, "
                         f"sharding {order.sharded!r}); it takes the dict that FastLoader.state_dict() returns.")
    return order
