"""What Keras's evaluate and predict read from a FastLoader that shards itself (kfast.data._keras_calls): the
whole set, in index order, whatever the rank, while fit trains on the rank's shard. Explicit rank= and size=
stand in for a Horovod job here, so these run in one process on every backend; the two-rank runs are in
tests/distributed/test_evaluate.py. The first test fails when a Keras release changes what kfast wraps."""

import inspect

import keras
import numpy as np
import pytest

from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import ShardedDataset
from kfast.data import _keras_adapter


def test_keras_still_has_the_calls_kfast_wraps_and_they_are_wrapped_once():
    assert _keras_adapter.install()
    for kind in ("evaluate", "predict"):
        method = getattr(keras.Model, kind)
        assert getattr(method, "__kfast_wrapped__", False)
        assert not getattr(method.__wrapped__, "__kfast_wrapped__", False)
        assert {"x", "callbacks"} <= set(inspect.signature(method.__wrapped__).parameters)
    # What the tf.data path relies on, after Keras's own loop.
    assert callable(keras.Model.get_metrics_result) and callable(keras.Model._flatten_metrics_in_order)


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"], jit_compile=False)
    return model


def _data(n=23):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


@pytest.mark.parametrize("rank", [0, 1])
def test_evaluate_and_predict_read_the_whole_set_while_fit_trains_on_the_shard(rank):
    x, y = _data()  # 6 batches of 4, the last of 3: 3 per rank when training
    model = _model()
    want = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    with FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False, rank=rank, size=2,
                    seed=5) as loader:
        before = loader.state_dict()
        assert model.evaluate(loader, verbose=0, return_dict=True) == want
        assert loader.state_dict() == before  # evaluating moves no part of the training position
        assert len(loader) == 3
        trained = []

        class Seen(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                trained.append(batch)

        model.fit(loader, epochs=1, verbose=0, shuffle=False, callbacks=[Seen()])
        assert trained == [0, 1, 2]
    with FastLoader(ArrayDataset(x, batch_size=4), workers=1, use_multiprocessing=False, rank=rank, size=2) as inputs:
        got = model.predict(inputs, verbose=0)
    np.testing.assert_array_equal(got, model.predict(x, batch_size=4, verbose=0))
    assert got.shape == (23, 1)


def test_a_sharded_dataset_passed_in_keeps_its_layout_and_evaluate_says_it_is_one_ranks(recwarn):
    x, y = _data()
    shard = ShardedDataset(ArrayDataset(x, y, batch_size=4), rank=1, size=2, mode="all")
    with FastLoader(shard, workers=1, use_multiprocessing=False) as loader:
        assert len(loader) == 3
        _model().evaluate(loader, verbose=0)
    # One process: no rank's result stands in for the whole job's, so nothing to warn about.
    assert not [w for w in recwarn if "each rank its own part" in str(w.message)]
