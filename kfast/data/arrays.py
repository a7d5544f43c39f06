"""ArrayDataset: batches sliced from in-memory arrays."""

import keras
import numpy as np

from kfast.checks import check_int


class ArrayDataset(keras.utils.PyDataset):
    """Serves `(x, y, sample_weight)` batches from in-memory arrays.

    With `shuffle=True` the samples are permuted anew each epoch by `set_epoch(epoch)`, a pure function
    of `seed` and the epoch, so FastLoader workers agree on it without receiving the arrays again.
    FastLoader gathers each batch straight into the shared memory it travels in (`fill_batch`).

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

    def __init__(self, x, y=None, sample_weight=None, batch_size=32, shuffle=False, seed=0):
        super().__init__()
        check_int("ArrayDataset", "batch_size", batch_size)
        self._parts = [part for part in (x, y, sample_weight) if part is not None]
        lengths = {len(a) for part in self._parts for a in keras.tree.flatten(part)}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(
                f"ArrayDataset got arrays with first dimensions {sorted(lengths)}; x, y and sample_weight "
                "must all hold the same, non-zero number of samples.")
        self.num_samples = lengths.pop()
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._order = None
        self.set_epoch(0)

    def set_epoch(self, epoch):
        """Selects epoch `epoch`'s sample order (a no-op without shuffle)."""
        if self.shuffle:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __len__(self):
        return -(-self.num_samples // self.batch_size)

    def __getitem__(self, index):
        rows = self._rows(index)
        batch = tuple(keras.tree.map_structure(lambda a: np.asarray(a)[rows], part) for part in self._parts)
        return batch[0] if len(batch) == 1 else batch

    def fill_batch(self, index, out):
        """Writes batch `index` into `out`, arrays shaped like batch 0's, and returns its number of samples.

        FastLoader calls this instead of `__getitem__`, so that each batch is gathered straight into the
        shared memory it travels in.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"ArrayDataset index {index} is out of range for {len(self)} batches.")
        rows = self._rows(index)
        count = min(self.batch_size, self.num_samples - index * self.batch_size)
        parts = tuple(self._parts)
        keras.tree.map_structure(lambda a, dst: _gather(a, rows, dst[:count]), parts,
                                 out if len(parts) > 1 else (out,))
        return count

    def _rows(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        if self._order is not None:
            rows = np.sort(self._order[rows])  # sorted rows make the gather read memory in order
        return rows


def _gather(array, rows, out):
    array = np.asarray(array)
    if isinstance(rows, slice):
        np.copyto(out, array[rows], casting="no")
    else:
        # mode="clip" (the rows are valid anyway): the default, "raise", gathers into a temporary first.
        np.take(array, rows, axis=0, out=out, mode="clip")
