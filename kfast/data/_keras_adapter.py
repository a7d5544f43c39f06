"""How Keras's `fit`/`evaluate`/`predict` read a FastLoader: one iteration of the loader per Keras epoch, with
`fit`'s `shuffle`.

NOTE [ Keras's shuffle and a loader that loads ahead ]
Keras passes `fit(shuffle=...)` to the `PyDatasetAdapter` it wraps around a PyDataset, whose `_get_iterator`
then asks the dataset for `dataset[i]` in an order it draws itself (`random.shuffle`), one index at a time.
A loader that loads ahead must know the order before the epoch's first batch, and Keras offers no hook that
tells a dataset. This module is kfast's one workaround: it wraps `PyDatasetAdapter._get_iterator` so that,
for a dataset with `_keras_epoch` (a FastLoader), the adapter reads one iteration of the loader,
`dataset._keras_epoch(adapter.shuffle)`, instead. Any other dataset is read as before.

Nothing depends on it for correctness: were the wrap gone (a Keras release that renames the method), Keras
would read a FastLoader as any PyDataset, `loader[i]` in its own order, each batch loaded when asked, and
every batch of every epoch would still come exactly once. tests/data/test_keras_adapter.py fails when the
method it wraps changes.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_lock = threading.Lock()
_installed = False


def _wrap(original: Any) -> Any:
    @functools.wraps(original)
    def _get_iterator(adapter: Any) -> Any:
        epoch = getattr(adapter.py_dataset, "_keras_epoch", None)
        if epoch is None:
            return original(adapter)
        return (adapter._standardize_batch(batch) for batch in epoch(bool(adapter.shuffle)))

    _get_iterator.__kfast_wrapped__ = True  # type: ignore[attr-defined]
    return _get_iterator


def install() -> bool:
    """Wraps Keras's `PyDatasetAdapter._get_iterator` once per process; returns whether it is wrapped."""
    global _installed
    with _lock:
        if _installed:
            return True
        from keras.src.trainers.data_adapters import py_dataset_adapter  # Keras's private tree: here only

        adapter: Any = getattr(py_dataset_adapter, "PyDatasetAdapter", None)
        original = getattr(adapter, "_get_iterator", None)
        if original is None or not hasattr(adapter, "_standardize_batch"):
            return False
        if not getattr(original, "__kfast_wrapped__", False):
            adapter._get_iterator = _wrap(original)
        import keras

        from kfast.data import _keras_calls
        from kfast.data import _keras_guard

        _keras_guard.install(keras.Model)  # Ctrl-C ends a script's stuck call within a bound (innermost)
        _keras_calls.install(keras.Model)  # what evaluate and predict read (see that module's NOTE)
        _installed = True
        return True
