"""What kfast needs to know of a `tf.data.Dataset` before it decides where one goes: whether an object is
one, its batch size when the pipeline fixes it, and what FastLoader says when it is handed one.

Nothing here imports TensorFlow: an object can only be a `tf.data.Dataset` once TensorFlow is loaded, so
the check asks `sys.modules` and costs nothing in a process (a loader worker, `kfast doctor`) without it.
"""

from __future__ import annotations

import sys
from typing import Any


def is_tf_dataset(obj: Any) -> bool:
    """True when `obj` is a `tf.data.Dataset` (any of its transformations), without importing TensorFlow.

    Example:

    >>> is_tf_dataset([1, 2, 3])
    False
    >>> import tensorflow as tf
    >>> is_tf_dataset(tf.data.Dataset.range(3).batch(2))
    True
    """
    tf = sys.modules.get("tensorflow")
    data = getattr(tf, "data", None)
    dataset_type = getattr(data, "Dataset", None)
    return isinstance(dataset_type, type) and isinstance(obj, dataset_type)


def static_batch_size(dataset: Any) -> int | None:
    """The batch size every element of `dataset` has, when its `element_spec` fixes it (the first dimension
    of every component is the same known number, as after `batch(n, drop_remainder=True)`), else `None`
    (a plain `batch(n)` may end an epoch with a smaller batch, so its first dimension is unknown).

    Example:

    >>> import tensorflow as tf
    >>> static_batch_size(tf.data.Dataset.range(10).batch(4, drop_remainder=True))
    4
    >>> static_batch_size(tf.data.Dataset.range(10).batch(4)) is None
    True
    """
    import tensorflow as tf

    sizes = set()
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            return None
        sizes.add(shape[0])
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return int(size) if size is not None else None


def fastloader_refusal(dataset: Any) -> str:
    """What FastLoader says to a `tf.data.Dataset`: where such a pipeline goes instead.

    Example:

    >>> import tensorflow as tf
    >>> print(fastloader_refusal(tf.data.Dataset.range(3)))  # doctest: +ELLIPSIS
    FastLoader got a tf.data.Dataset (_RangeDataset), which TensorFlow already loads ahead in its own threads...
    """
    return (f"FastLoader got a tf.data.Dataset ({type(dataset).__name__}), which TensorFlow already loads ahead in "
            "its own threads; FastLoader wraps Python datasets with __len__ and __getitem__. Pass the dataset to "
            "model.fit as it is, tuned with kfast.tune(dataset, model=model).loader(dataset). If its work is Python "
            "(tf.py_function, tf.numpy_function, Dataset.from_generator), move that function into a "
            "keras.utils.PyDataset (__len__, and __getitem__ returning one batch) and pass "
            "kfast.data.FastLoader(that_dataset) to fit instead; kfast's docs show it (tf-data.md).")
