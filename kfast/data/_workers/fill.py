"""The `fill_batch(index, out)` protocol: a dataset writes a batch into arrays FastLoader lends it.

A dataset that defines `fill_batch` is handed `out`, the structure of batch 0 with every leaf an empty
array of batch 0's shape and dtype, and writes batch `index` into it. In worker processes those arrays
are views of the batch's shared-memory slot, so the batch is written once, where the training process
reads it, instead of built in the worker's own memory and then copied into the slot. It returns `None`
when it filled every sample, or the number of leading samples it wrote (a short last batch); the
loader then hands out only those. This module imports numpy and kfast's structure helpers only: worker
processes load it.
"""

import math

import numpy as np

from kfast.data import structure


def method(dataset):
    """The dataset's `fill_batch`, or None when it has none (its batches come from `__getitem__`)."""
    fill = getattr(dataset, "fill_batch", None)
    return fill if callable(fill) else None


def fill(fill_batch, index, template, buffer=None, offset=0):
    """Has `fill_batch` write batch `index` into views of `buffer` from `offset` (fresh arrays if None).

    Returns:
        `(layout, leaves)`: the layout of what was written (short in the first dimension when
        `fill_batch` wrote fewer samples) and the written leaves.

    Raises:
        ValueError: when `fill_batch` returns something else than None or a sample count that fits.
    """
    spec, layout = template
    if buffer is None:
        leaves = [np.empty(shape, dtype) for dtype, shape, _ in layout]
    else:
        leaves = [np.ndarray(shape, dtype, buffer=buffer, offset=offset + at) for dtype, shape, at in layout]
    rows = fill_batch(index, structure.unflatten(spec, leaves))
    if rows is None:
        return layout, leaves
    most = min((shape[0] for _, shape, _ in layout if shape), default=0)
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or not 1 <= rows <= most:
        raise ValueError(
            f"fill_batch({index}, out) of {_owner(fill_batch)} returned {rows!r}; it must return None (every "
            f"sample of `out` written) or the number of leading samples it wrote, an int from 1 to {most}.")
    rows = int(rows)
    # The first `rows` samples of a C-ordered array are its first bytes, so the short batch keeps its offsets.
    layout = [(dtype, (rows,) + tuple(shape[1:]) if shape else shape, at) for dtype, shape, at in layout]
    return layout, [leaf[:rows] if leaf.ndim else leaf for leaf in leaves]


def nbytes(template):
    """Bytes the template's arrays span in a slot (its last leaf's end)."""
    _, layout = template
    return max((at + math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape, at in layout), default=0)


def template_of(dataset):
    """Batch 0's `(spec, layout)`, the arrays `fill_batch` is lent, or None when the dataset has no
    `fill_batch` or batch 0 is not plain numeric arrays. It loads batch 0 with `__getitem__`: run it where
    batches are loaded (a worker), never in the training process."""
    if method(dataset) is None:
        return None
    spec, leaves = structure.flatten(dataset[0])  # a whole batch: only the last may be short
    layout, _ = structure.shm_layout(leaves)
    return (spec, layout) if layout is not None else None


def new_batch(fill_batch, template, index):
    """Batch `index` written by `fill_batch` into fresh arrays (worker threads, or no free slot)."""
    _, leaves = fill(fill_batch, index, template)
    return structure.unflatten(template[0], leaves)


def _owner(fill_batch):
    owner = getattr(fill_batch, "__self__", None)
    return type(owner).__name__ if owner is not None else "the dataset"
