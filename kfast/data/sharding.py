"""Split a dataset's batches across ranks so that every rank gets the same number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kfast._core.tf_datasets import is_tf_dataset
from kfast.data._shard_checks import check_enough
from kfast.data._shard_checks import check_shard
from kfast.data._workers.worker_form import worker_form



class ShardedDataset:
    """The batches of `dataset` that belong to one rank: indices rank, rank + size, rank + 2 * size, ...

    Every rank gets the same number of batches, so collectives pair up step by step and no rank waits
    for another at the end of an epoch:
    - `"drop"` (default): `len(dataset) // size` batches each; up to `size - 1` trailing batches are
      left out of the epoch. With equal batch sizes, averaged metrics then equal the global ones.
    - `"pad"`: `ceil(len(dataset) / size)` batches each; ranks short of batches repeat batches from the
      start of the dataset, so no batch is left out but a few are seen twice.
    - `"all"`: every batch exactly once, so ranks may differ by one batch. For `evaluate` and `predict`
      only, whose steps need no collective (`kfast.callbacks.MetricAverage` combines the results); `fit`
      refuses ranks with unequal steps.

    Args:
        dataset: anything with `__len__` and `__getitem__`.
        rank: this process's rank.
        size: number of ranks.
        mode: `"drop"`, `"pad"` or `"all"`. Defaults to `"drop"`.
        start: batches at the start of the epoch that are already trained and left out (an elastic job
            going on mid-epoch with a new number of ranks). Defaults to `0`.

    Raises:
        ValueError: for a bad rank, size or mode, or too few batches for the ranks.

    Example:

    >>> shard = kfast.data.shard(list(range(10)), rank=1, size=4)
    >>> [shard[i] for i in range(len(shard))]
    [1, 5]
    """

    def __init__(self, dataset: Any, rank: int, size: int, mode: str = "drop", start: int = 0) -> None:
        check_shard("ShardedDataset", rank, size, mode, start)
        n = len(dataset) - start
        check_enough("ShardedDataset", n, size)
        self.dataset, self.rank, self.size, self.mode, self.start = dataset, rank, size, mode, start
        self._len = {"drop": n // size, "pad": -(-n // size), "all": len(range(rank, n, size))}[mode]

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self._source(index)]

    @property
    def fill_batch(self) -> Callable[[int, Any], int]:
        """The wrapped dataset's `fill_batch` (see FastLoader) with this shard's indices; absent when it has none."""
        fill_batch = self.dataset.fill_batch  # AttributeError here makes __getattr__ report it absent too
        return lambda index, out: fill_batch(self._source(index), out)

    def worker_dataset(self) -> ShardedDataset:
        """This shard of the wrapped dataset's `worker_dataset()` (see FastLoader), or itself when it has none.

        Defined here, not forwarded: the wrapped dataset's own worker form would serve every batch, not
        this shard's.
        """
        worker = worker_form(self.dataset)
        if worker is self.dataset:
            return self
        return ShardedDataset(worker, self.rank, self.size, self.mode, self.start)

    def _source(self, index: int) -> int:
        if not 0 <= index < self._len:
            raise IndexError(f"ShardedDataset index {index} out of range for {self._len} batches.")
        return self.start + (self.rank + index * self.size) % (len(self.dataset) - self.start)

    def __getattr__(self, name: str) -> Any:
        # Forward on_epoch_end, set_epoch and friends to the wrapped dataset.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def shard(dataset: Any, rank: int, size: int, mode: str = "drop", start: int = 0) -> Any:
    """Returns rank `rank`'s shard of `dataset`: a `ShardedDataset` (see there), or for a
    `tf.data.Dataset` of batches a `tf.data.Dataset` with the same rule (see `kfast.data.tf_sharding`).

    Example:

    >>> [len(shard(list(range(10)), rank, 4, mode)) for mode in ("drop", "pad", "all") for rank in (0, 3)]
    [2, 2, 3, 3, 3, 2]
    """
    if is_tf_dataset(dataset):
        from kfast.data.tf_sharding import shard_tf_dataset

        return shard_tf_dataset(dataset, rank, size, mode, start)
    return ShardedDataset(dataset, rank, size, mode, start)

