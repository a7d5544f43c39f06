"""Input pipelines: FastLoader and in-memory datasets."""

from kfast.data.arrays import ArrayDataset
from kfast.data.loader import FastLoader
from kfast.data.loader import WorkerError

__all__ = ["ArrayDataset", "FastLoader", "WorkerError"]
