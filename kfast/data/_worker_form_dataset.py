"""WorkerFormDataset: a Keras `PyDataset` whose batches live in a keras-free object, which FastLoader's worker
processes load instead (see `kfast.data._workers.worker_form`)."""

from __future__ import annotations

from typing import Any

import keras


class WorkerFormDataset(keras.utils.PyDataset):
    """The Keras face of a keras-free batches object `self._batches` (its `set_epoch`, `__len__`, `__getitem__`),
    which `worker_dataset()` hands to the workers: `ArrayDataset`, `PackedDataset` and the image recipe's
    `ImageFolder` are such views."""

    _batches: Any

    def set_epoch(self, epoch: int) -> None:
        """Selects epoch `epoch`'s order of the samples (FastLoader calls it in every worker)."""
        self._batches.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, index: int) -> Any:
        return self._batches[index]

    def worker_dataset(self) -> Any:
        """The same batches without Keras, for FastLoader's worker processes."""
        return self._batches
