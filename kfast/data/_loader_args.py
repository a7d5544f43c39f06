"""FastLoader's arguments: their checks and defaults, and what the dataset it wraps defines."""

from __future__ import annotations

import random
import warnings
from typing import Any

import keras

from kfast._core.cpus import usable_cpus
from kfast.data.sharding import ShardedDataset

MAX_TASKS_PER_WORKER = 128
# Keras warns "Your input ran out of data" when an epoch has fewer batches than `len()` said; a resumed
# epoch has, by design.
RAN_OUT = "Your input ran out of data"


def default_workers() -> int:
    """One worker per usable CPU core (at most 16)."""
    return max(1, min(16, usable_cpus()))


def length(dataset: Any) -> int:
    """Batches per epoch: `len(dataset)`, or a Keras PyDataset's finite `num_batches`."""
    if hasattr(dataset, "__len__"):
        return len(dataset)
    n = getattr(dataset, "num_batches", None)
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    raise TypeError(
        f"FastLoader needs to know how many batches {type(dataset).__name__} has per epoch: give it __len__ "
        f"(or a PyDataset's num_batches property returning an int); got num_batches={n!r}. Infinite datasets "
        "are not supported.")


def capped_workers(workers: int | None) -> int | None:
    most = 4 * usable_cpus()
    if workers is not None and not isinstance(workers, bool) and isinstance(workers, int) and workers > most:
        warnings.warn(f"FastLoader got workers={workers}, more than 4 per usable CPU core ({usable_cpus()} cores); "
                      f"using {most}. More workers than that only compete for the same cores.", stacklevel=3)
        return most
    return workers


def overrides(dataset: Any, method: str) -> bool:
    if isinstance(dataset, ShardedDataset):
        dataset = dataset.dataset
    own = getattr(type(dataset), method, None)
    return own is not None and own is not getattr(keras.utils.PyDataset, method, None)


def default_seed() -> int:
    # Python's generator, which keras.utils.set_random_seed seeds and Keras's own PyDataset shuffle draws from:
    # the same script with the same global seed gets the same order; without one, a new order every run.
    return random.getrandbits(63)


def keras_data_shards() -> tuple[int, int] | None:
    """(shard id, shard count) of Keras's own distribution when it spans several processes and shards data
    (`keras.distribution.DataParallel()` set by the user, `auto_shard_dataset` on), else None.

    Keras shards a PyDataset itself then, but passes a data adapter (a FastLoader) through untouched: the loader
    follows the same split, so that the two together read every batch once."""
    distribution = keras.distribution.distribution()
    if distribution is None or not getattr(distribution, "auto_shard_dataset", False):
        return None
    processes = int(getattr(distribution, "num_processes", 1) or 1)
    if processes < 2:
        return None
    # Keras's own count of data shards (`num_data_shards` from Keras 3.16 on): one per model replica, at most one
    # per process.
    count = getattr(distribution, "num_data_shards", None)
    count = int(count) if count is not None else min(int(distribution.num_model_replicas), processes)
    return (int(distribution.data_shard_id), count) if count > 1 else None
