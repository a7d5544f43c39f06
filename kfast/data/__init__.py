"""Input pipelines: FastLoader, in-memory datasets and sharding across ranks."""

from kfast.data.arrays import ArrayDataset
from kfast.data.loader import FastLoader
from kfast.data.loader import WorkerError
from kfast.data.shard import ShardedDataset
from kfast.data.shard import shard

__all__ = ["ArrayDataset", "FastLoader", "ShardedDataset", "WorkerError", "shard"]
