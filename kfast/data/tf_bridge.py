"""A bridge from FastLoader to `tf.data`, for pipelines that continue in TensorFlow."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from kfast.data import structure

if TYPE_CHECKING:
    import tensorflow as tf

    from kfast.data.loader import FastLoader


def _spec(batch: Any) -> Any:
    import tensorflow as tf

    spec, leaves = structure.flatten(batch)
    # The first dimension varies (the last batch may be smaller); the others are taken as fixed.
    specs = [tf.TensorSpec((None,) + np.shape(leaf)[1:], np.asarray(leaf).dtype) for leaf in leaves]
    return structure.unflatten(spec, specs)


def to_tf_dataset(loader: FastLoader) -> tf.data.Dataset:
    """Returns a `tf.data.Dataset` yielding one epoch of `loader`'s batches, with AUTOTUNE prefetch.

    Example:

    >>> import numpy as np, kfast
    >>> data = kfast.data.ArrayDataset(np.zeros((6, 2)), np.arange(6), batch_size=2)
    >>> ds = kfast.data.FastLoader(data, use_multiprocessing=False).to_tf_dataset()
    >>> [y.numpy().tolist() for x, y in ds]
    [[0, 1], [2, 3], [4, 5]]
    """
    import tensorflow as tf

    signature = _spec(loader[0])
    return tf.data.Dataset.from_generator(lambda: iter(loader), output_signature=signature).prefetch(
        tf.data.AUTOTUNE)
