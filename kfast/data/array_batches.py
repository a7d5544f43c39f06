"""ArrayBatches: batches sliced from in-memory arrays, with numpy alone.

It is `ArrayDataset`'s batching without Keras, so that FastLoader's worker processes, which receive it
through `ArrayDataset.worker_dataset()`, never import Keras or TensorFlow (seconds per process start).
It imports numpy and kfast's keras-free helpers only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kfast._core.checks import check_int
from kfast.data import structure


class ArrayBatches:
    """Serves `(x, y, sample_weight)` batches from in-memory arrays; what `ArrayDataset` serves.

    Use `kfast.data.ArrayDataset` (a `keras.utils.PyDataset`, for `model.fit` too); this class is its
    keras-free core, the form FastLoader's worker processes load. It works anywhere a dataset with
    `__len__` and `__getitem__` does. With `shuffle=True` the samples are permuted anew each epoch by
    `set_epoch(epoch)`, a pure function of `seed` and the epoch. `fill_batch` gathers a batch straight
    into arrays FastLoader lends it.

    Args:
        x, y, sample_weight, batch_size, shuffle, seed: as for `kfast.data.ArrayDataset`.
        name: what error messages call this dataset (ArrayDataset passes its own name). Defaults to
            `"ArrayBatches"`.

    Raises:
        ValueError: for an empty input, mismatched lengths or a bad batch size.

    Example:

    >>> from kfast.data.array_batches import ArrayBatches
    >>> data = ArrayBatches({"a": np.arange(10), "b": np.ones((10, 2))}, np.arange(10), batch_size=4)
    >>> len(data), data[2][0]["a"].tolist(), data[2][1].tolist()
    (3, [8, 9], [8, 9])
    """

    def __init__(self, x: Any, y: Any = None, sample_weight: Any = None, batch_size: int = 32, shuffle: bool = False,
                 seed: int = 0, *, name: str = "ArrayBatches") -> None:
        check_int(name, "batch_size", batch_size)
        self._name = name
        self._parts = tuple(part for part in (x, y, sample_weight) if part is not None)
        self._leaves = structure.flatten(self._parts)[1]  # in the order fill_batch's `out` flattens to
        lengths = {len(a) for a in self._leaves}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(
                f"{name} got arrays with first dimensions {sorted(lengths)}; x, y and sample_weight "
                "must all hold the same, non-zero number of samples.")
        self.num_samples = lengths.pop()
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._order: np.ndarray | None = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Selects epoch `epoch`'s sample order (a no-op without shuffle)."""
        if self.shuffle:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __getitem__(self, index: int) -> Any:
        rows = self._rows(index)
        batch = tuple(_take(part, rows) for part in self._parts)
        return batch[0] if len(batch) == 1 else batch

    def fill_batch(self, index: int, out: Any) -> int:
        """Writes batch `index` into `out`, arrays shaped like batch 0's, and returns its number of samples.

        FastLoader calls this instead of `__getitem__`, so that each batch is gathered straight into the
        shared memory it travels in.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"{self._name} index {index} is out of range for {len(self)} batches.")
        rows = self._rows(index)
        count = min(self.batch_size, self.num_samples - index * self.batch_size)
        # `out` was built from batch 0 by kfast.data.structure, so both flatten to leaves in the same order.
        sources = self._leaves
        targets = structure.flatten(out if len(self._parts) > 1 else (out,))[1]
        if len(sources) != len(targets):
            raise ValueError(f"{self._name}.fill_batch got `out` with {len(targets)} arrays; its batches hold "
                             f"{len(sources)}. Pass batch 0's structure, as FastLoader does.")
        for array, dst in zip(sources, targets):
            _gather(array, rows, dst[:count])
        return count

    def _rows(self, index: int) -> slice | np.ndarray:
        rows: slice | np.ndarray = slice(index * self.batch_size, (index + 1) * self.batch_size)
        if self._order is not None:
            rows = np.sort(self._order[rows])  # sorted rows make the gather read memory in order
        return rows


def _take(node: Any, rows: slice | np.ndarray) -> Any:
    """`node`'s arrays at `rows`, in `node`'s own nesting (dict order, lists, tuples and namedtuples kept, as
    `keras.tree.map_structure` keeps them)."""
    if isinstance(node, dict):
        return {key: _take(value, rows) for key, value in node.items()}
    if isinstance(node, list):
        return [_take(value, rows) for value in node]
    if isinstance(node, tuple):
        items = [_take(value, rows) for value in node]
        return type(node)(*items) if hasattr(node, "_fields") else tuple(items)
    return np.asarray(node)[rows]


def _gather(array: Any, rows: slice | np.ndarray, out: np.ndarray) -> None:
    array = np.asarray(array)
    if isinstance(rows, slice):
        np.copyto(out, array[rows], casting="no")
    else:
        # mode="clip" (the rows are valid anyway): the default, "raise", gathers into a temporary first.
        np.take(array, rows, axis=0, out=out, mode="clip")
