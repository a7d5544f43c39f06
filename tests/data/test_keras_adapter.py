"""kfast's one workaround for Keras's `fit(shuffle=...)` (kfast.data._keras_adapter): these tests fail when a
Keras release changes what it wraps, so that the loader's loading ahead is not lost unnoticed."""

import keras
import numpy as np
from keras.src.trainers.data_adapters import py_dataset_adapter

from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import _keras_adapter


def test_keras_still_has_the_method_kfast_wraps_and_it_is_wrapped_once():
    assert _keras_adapter.install()
    assert _keras_adapter.install()
    method = py_dataset_adapter.PyDatasetAdapter._get_iterator
    assert getattr(method, "__kfast_wrapped__", False)
    assert not getattr(method.__wrapped__, "__kfast_wrapped__", False)  # wrapped once, not twice
    # What the wrap relies on: the adapter keeps the dataset and fit's shuffle, and standardizes batches.
    adapter = py_dataset_adapter.PyDatasetAdapter(ArrayDataset(np.ones((4, 1)), np.ones(4), batch_size=2), shuffle=True)
    assert adapter.shuffle is True and adapter.py_dataset is not None and callable(adapter._standardize_batch)


def test_fit_reads_a_fast_loader_through_its_own_epochs_and_a_plain_pydataset_as_before():
    x = np.arange(8, dtype="float32").reshape(-1, 1)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with FastLoader(ArrayDataset(x, x, batch_size=2), workers=1, use_multiprocessing=False) as loader:
        model.fit(loader, epochs=2, verbose=0)
        # Each Keras epoch was one iteration of the loader (the loader's epochs 0 and 1; Keras on TensorFlow
        # may begin the next as the last ends).
        assert loader.state_dict()["epoch"] >= 2
    asked = []

    class Plain(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            asked.append(i)
            return x[2 * i:2 * i + 2], x[2 * i:2 * i + 2]

    model.fit(Plain(), epochs=1, verbose=0, shuffle=False)
    assert asked[-4:] == [0, 1, 2, 3]  # Keras's own reading, untouched
