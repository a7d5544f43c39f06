"""Sharding a `tf.data.Dataset` of batches across ranks, with the same number of batches on every rank.

`dataset.shard(size, rank)` alone gives ranks unequal counts when the batches do not divide evenly (1,563
batches on 2 ranks: 782 and 781), and the rank with one more step waits in an allreduce for ever. Here the
remainder is dropped or padded first, as `kfast.data.ShardedDataset` does for a PyDataset.

Sharding after batching is the only place a finished pipeline can be cut, so every rank still runs the
pipeline's maps for every batch and keeps its share: the input work per rank does not shrink with more
ranks. Where that matters, shard the file list before decoding (`tf.data.Dataset.list_files(...).shard(...)`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kfast._core import topology
from kfast.data._shard_checks import check_enough
from kfast.data._shard_checks import check_shard
from kfast.distributed import collectives


def _count(dataset: Any, start: int) -> int:
    import tensorflow as tf

    n = int(dataset.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError("kfast.data.shard got an infinite tf.data.Dataset (a repeat() with no count); shard the "
                         "finite pipeline and repeat after, or pass steps_per_epoch to fit and shard by hand.")
    if n == tf.data.UNKNOWN_CARDINALITY:
        raise ValueError("kfast.data.shard got a tf.data.Dataset whose number of batches tf.data cannot tell (a "
                         "filter(), from_generator or a text reader upstream), so it cannot give every rank the same "
                         "count; state it with dataset.apply(tf.data.experimental.assert_cardinality(n)).")
    return n - start


def _labels_fingerprint(dataset: Any) -> str | None:
    """A hash of the first batch's labels (and weights), or None for batches without them. Labels, not
    inputs: random augmentation changes a batch's inputs from rank to rank, not its labels."""
    import tensorflow as tf

    for element in dataset.take(1):
        if not isinstance(element, (tuple, list)) or len(element) < 2:
            return None
        digest = hashlib.sha256()
        for leaf in tf.nest.flatten(element[1:]):
            digest.update(leaf.numpy().tobytes())
        return digest.hexdigest()
    return None


def _check_same_order(dataset: Any, check_order: bool) -> None:
    if not (check_order and topology.size() > 1):
        return
    prints = collectives.allgather_object(_labels_fingerprint(dataset))
    if len(set(prints)) > 1:
        differ = [r for r, p in enumerate(prints) if p != prints[0]]
        raise ValueError(
            f"kfast.data.shard: rank 0 and rank {differ[0]} read different first batches (their labels differ), so "
            "the pipeline's order differs between ranks, and sharding it would give ranks overlapping batches and "
            "leave others out. Give every shuffle a seed, the same on every rank: image_dataset_from_directory(..., "
            "seed=1337), dataset.shuffle(buffer, seed=1337). If your labels are random by design (mixup in the "
            "pipeline), pass check_order=False.")


def shard_tf_dataset(dataset: Any, rank: int, size: int, mode: str = "drop", start: int = 0, *,
                     check_order: bool = True) -> Any:
    """Returns rank `rank`'s shard of a `tf.data.Dataset` of batches, as a `tf.data.Dataset`.

    Batches are dealt in turn (rank, rank + size, ...), after the remainder is settled by `mode`, as for
    `kfast.data.ShardedDataset`: `"drop"` leaves out the last `n % size` batches of each epoch, `"pad"`
    repeats batches from the start of the next pass to fill the last round, and `"all"` keeps every batch
    once (ranks may differ by one): evaluate an `"all"` shard with `callbacks=[kfast.callbacks.MetricAverage()]`,
    which sums the metrics over the ranks (Keras tells kfast nothing of the pipeline it evaluates, so without it
    each rank gets its own part's numbers). Under Horovod, ranks first compare their
    first batch's labels (a collective: call it on every rank), since a pipeline shuffled without a seed
    orders each rank's batches differently.

    Args:
        dataset: a finite `tf.data.Dataset` of batches whose cardinality tf.data knows.
        rank: this process's rank.
        size: number of ranks.
        mode: `"drop"`, `"pad"` or `"all"`. Defaults to `"drop"`.
        start: batches at the start of the epoch to leave out (already trained). Defaults to `0`.
        check_order: compare the ranks' first batches under Horovod. Defaults to `True`.

    Returns:
        The shard, a `tf.data.Dataset` whose cardinality is its number of batches.

    Raises:
        ValueError: for a bad rank, size or mode, an infinite or unknown-length dataset, fewer batches than
            ranks, or ranks whose pipelines are in different orders.

    Example:

    >>> import tensorflow as tf
    >>> batches = tf.data.Dataset.range(10).batch(2)  # 5 batches
    >>> [[b.numpy().tolist() for b in shard_tf_dataset(batches, rank, 2)] for rank in (0, 1)]
    [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    >>> [int(shard_tf_dataset(batches, 1, 2, "pad").cardinality()), int(shard_tf_dataset(batches, 1, 2, "all").cardinality())]
    [3, 2]
    """
    check_shard("kfast.data.shard", rank, size, mode, start)
    n = _count(dataset, start)
    check_enough("kfast.data.shard", n, size)
    _check_same_order(dataset, check_order)
    source = dataset.skip(start) if start else dataset
    if mode == "drop":
        source = source.take(n // size * size)
    elif mode == "pad":
        source = source.repeat().take(-(-n // size) * size)
    return source.shard(size, rank)
