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

The handshake: `restore()` offers the recorded order (`offer`); the first FastLoader over a dataset of
that length takes it at its first use (`take`), which for `fit` is Keras's look at the first batches,
before any batch is loaded, so no trained batch is loaded again. kfast's callbacks open a window at each
epoch's start (`expect`); the next FastLoader to begin an epoch inside Keras's loop is that fit's
training loader (`claim`), whose view the checkpoint records (`training_loader`).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import numpy as np

# How a loader's dataset is split over ranks: by the loader itself, or by a ShardedDataset of the user's.
OWN, GIVEN = "loader", "given"


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
    """

    seeds: tuple[int, ...]
    size: int
    epoch: int
    shuffled: bool
    total: int
    sharded: str
    done: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The JSON form a checkpoint stores."""
        return {**dataclasses.asdict(self), "seeds": list(self.seeds)}

    @classmethod
    def from_dict(cls, value: Any) -> EpochOrder | None:
        """The order stored by `as_dict`, or None for anything else (an older checkpoint)."""
        try:
            order = cls(tuple(int(s) for s in value["seeds"]), int(value["size"]), int(value["epoch"]),
                        bool(value["shuffled"]), int(value["total"]), str(value["sharded"]), int(value["done"]))
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


@dataclasses.dataclass
class _Offer:
    order: EpochOrder


_lock = threading.Lock()
_offer: _Offer | None = None
_taker: weakref.ReferenceType[Any] | None = None  # the loader that took the last offer
# The window kfast's callbacks open at an epoch's start; the loader that begins the epoch next claims it.
_expecting: weakref.ReferenceType[Any] | None = None
_training: weakref.WeakKeyDictionary[Any, weakref.ReferenceType[Any]] = weakref.WeakKeyDictionary()


def offer(order: EpochOrder | None) -> None:
    """Makes `order` the one the next matching FastLoader takes (None withdraws an earlier offer)."""
    global _offer, _taker
    with _lock:
        _offer, _taker = (_Offer(order) if order is not None else None), None


def take(total: int, sharded: str) -> EpochOrder | None:
    """The order offered for a loader over `total` batches of that kind of sharding, once; else None."""
    global _offer
    with _lock:
        if _offer is None or _offer.order.total != total or _offer.order.sharded != sharded:
            return None
        order, _offer = _offer.order, None
        return order


def took(loader: Any) -> None:
    """Records `loader` as the one that took the offer."""
    global _taker
    _taker = weakref.ref(loader)


def taker() -> Any:
    """The loader that took the last offer, while it lives; else None."""
    return _taker() if _taker is not None else None


def pending() -> EpochOrder | None:
    """The order offered and not yet taken."""
    return _offer.order if _offer is not None else None


def expect(model: Any) -> None:
    """Opens the window: the next loader to begin an epoch in a Keras loop is `model`'s training loader."""
    global _expecting
    _training.pop(model, None)  # a loader of an earlier fit is not this one's
    _expecting = weakref.ref(model)


def close_window() -> None:
    """Closes the window (the epoch's first batch is trained: a loader beginning now is a validation one)."""
    global _expecting
    _expecting = None


def claim(loader: Any) -> None:
    """Called by a loader beginning an epoch inside a Keras loop: it becomes the training loader if expected."""
    global _expecting
    model = _expecting() if _expecting is not None else None
    if model is not None:
        _training[model] = weakref.ref(loader)
        _expecting = None


def training_loader(model: Any) -> Any:
    """The FastLoader of `model`'s current `fit`, or None (its data is not a FastLoader, or none began)."""
    ref = _training.get(model)
    return ref() if ref is not None else None


def epoch_offset(model: Any) -> int:
    """Batches of `model`'s current epoch trained before this fit (inside a resumed epoch; else 0)."""
    loader = training_loader(model)
    return loader.epoch_offset if loader is not None else 0
