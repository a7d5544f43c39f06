"""ArrayDataset: batches sliced from in-memory arrays."""

from __future__ import annotations

from typing import Any

from kfast.data._worker_form_dataset import WorkerFormDataset
from kfast.data.array_batches import ArrayBatches


class ArrayDataset(WorkerFormDataset):
    """Serves `(x, y, sample_weight)` batches from in-memory arrays.

    With `shuffle=True` the samples are permuted anew each epoch by `set_epoch(epoch)`, a pure function
    of `seed` and the epoch, so FastLoader workers agree on it without receiving the arrays again.
    FastLoader gathers each batch straight into the shared memory it travels in (`fill_batch`), and its
    worker processes load `worker_dataset()`, the same batches without Keras, so they start in a fraction
    of a second instead of importing TensorFlow.

    Args:
        x: array, or list/tuple/dict of arrays, with the same first dimension.
        y: targets, same form as `x`. Defaults to `None`.
        sample_weight: per-sample weights. Defaults to `None`.
        batch_size: samples per batch; the last batch holds the rest. Defaults to `32`.
        shuffle: permute samples each epoch. Defaults to `False`.
        seed: seed of the permutation. Defaults to `0`.

    Raises:
        ValueError: for an empty input, mismatched lengths or a bad batch size.

    Example:

    >>> data = kfast.data.ArrayDataset(np.zeros((100, 4)), np.ones(100), batch_size=32)
    >>> len(data), data[3][0].shape
    (4, (4, 4))
    """

    def __init__(self, x: Any, y: Any = None, sample_weight: Any = None, batch_size: int = 32, shuffle: bool = False,
                 seed: int = 0) -> None:
        super().__init__()
        self._batches = ArrayBatches(x, y, sample_weight, batch_size, shuffle, seed, name="ArrayDataset")

    # Read-only views of the settings: the batches hold them, and the workers receive the batches alone.
    num_samples = property(lambda self: self._batches.num_samples)
    batch_size = property(lambda self: self._batches.batch_size)
    shuffle = property(lambda self: self._batches.shuffle)
    seed = property(lambda self: self._batches.seed)

    def fill_batch(self, index: int, out: Any) -> int:
        """Writes batch `index` into `out`, arrays shaped like batch 0's, and returns its number of samples.

        FastLoader calls this instead of `__getitem__`, so that each batch is gathered straight into the
        shared memory it travels in.
        """
        return self._batches.fill_batch(index, out)

    def worker_dataset(self) -> ArrayBatches:
        """The same batches without Keras (an `ArrayBatches`), for FastLoader's worker processes."""
        return self._batches
