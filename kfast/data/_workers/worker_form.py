"""The `worker_dataset()` protocol: a dataset names a lighter object for FastLoader's worker processes.

A dataset whose class lives in a module that imports Keras makes every worker process import Keras, and
with it TensorFlow (about two seconds per fork server start). A dataset may define `worker_dataset()`,
returning an object that serves the same batches (`__len__`, `__getitem__`, and `fill_batch`/`set_epoch`
where the dataset has them) from a module that imports less; the workers unpickle that object instead,
and the fork server preloads its module. `kfast.data.ArrayDataset` returns its keras-free `ArrayBatches`.
This module imports nothing beyond the standard library.
"""

# Methods a worker calls when the dataset has them: a worker form without them would serve other batches
# (set_epoch: an unshuffled order) or be slower (fill_batch), silently.
_SAME_METHODS = ("fill_batch", "set_epoch")


def worker_form(dataset):
    """`dataset.worker_dataset()` when the dataset defines it, checked; `dataset` itself otherwise.

    Returns:
        The object worker processes load batches from.

    Raises:
        TypeError: when the worker form lacks `__getitem__`, or `fill_batch` or `set_epoch` where the
            dataset has them.
        ValueError: when its length differs from the dataset's (say, a wrapper that forwards unknown
            attributes answered with the wrapped dataset's worker form).
    """
    method = getattr(dataset, "worker_dataset", None)
    if not callable(method):
        return dataset
    worker = method()
    if worker is dataset:
        return dataset
    owner = type(dataset).__name__
    missing = [name for name in ("__getitem__",) + _SAME_METHODS
               if callable(getattr(dataset, name, None)) and not callable(getattr(worker, name, None))]
    if missing:
        raise TypeError(
            f"{owner}.worker_dataset() returned a {type(worker).__name__}, which lacks {', '.join(missing)}; "
            f"it must serve the same batches as the {owner}, with the same methods. Return an object that "
            "has them, or remove worker_dataset() to send the dataset itself.")
    want, got = _batches(dataset), _batches(worker)
    if got != want:
        raise ValueError(
            f"{owner}.worker_dataset() returned a {type(worker).__name__} of {got} batches, but the {owner} "
            f"has {want}; it must serve the same batches. A wrapper that forwards unknown attributes to a "
            "wrapped dataset needs a worker_dataset() of its own.")
    return worker


def _batches(dataset):
    """Batches per epoch, as FastLoader counts them (`len`, or a PyDataset's `num_batches`)."""
    return len(dataset) if hasattr(dataset, "__len__") else getattr(dataset, "num_batches", None)
