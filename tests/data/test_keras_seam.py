"""A FastLoader reaches Keras as its own data adapter (kfast.data._keras_epochs), nothing of Keras replaced: Keras
passes it through as is; training data is shuffled and sharded over the ranks, anything else is read whole, in
index order, on every rank, so `evaluate` and `predict` give one process's results whatever the order of a
script's lines. A topology of two ranks stands in for a Horovod job here (no collective runs); the two-rank
`horovodrun` runs are in tests/distributed/test_evaluate.py."""

import warnings

import keras
import numpy as np
import pytest
from keras.src.trainers.data_adapters import get_data_adapter

from kfast._core import keras_private
from kfast._core import keras_reads
from kfast._core import topology
from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import ShardedDataset


class _Rank(topology.SingleProcess):
    def __init__(self, rank):
        self._rank = rank

    def rank(self):
        return self._rank

    def size(self):
        return 2


@pytest.fixture(params=[0, 1])
def two_ranks(request):
    topology.set_current(_Rank(request.param))
    try:
        yield request.param
    finally:
        topology.set_current(None)


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"], jit_compile=False)
    return model


def _data(n=23):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def test_keras_still_passes_an_adapter_through_and_has_the_helpers_kfast_takes():
    x, y = _data()
    with FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False) as loader:
        assert get_data_adapter(loader, shuffle=True) is loader
    for name in set(keras_private.__all__) - {"super_batch_iterator"}:  # that one came with Keras 3.16
        assert getattr(keras_private, name) is not None, name
    assert isinstance(keras_private.SPEC_BATCHES, int)


def test_a_loader_built_inside_evaluate_and_predict_reads_the_whole_set_on_every_rank(two_ranks):
    x, y = _data()
    model = _model()
    topology.set_current(None)
    want = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    predicted = model.predict(x, batch_size=4, verbose=0)
    topology.set_current(_Rank(two_ranks))
    before = keras_reads.whole_reads()
    # The first FastLoader of the script, built inside the call: Python looks `model.evaluate` up first.
    got = model.evaluate(FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False),
                         verbose=0, return_dict=True)
    assert got == want
    assert keras_reads.whole_reads() == before + 1  # told to MetricAverage: nothing to sum over ranks
    out = model.predict(FastLoader(ArrayDataset(x, batch_size=4), workers=1, use_multiprocessing=False), verbose=0)
    np.testing.assert_array_equal(out, predicted)


def test_training_data_is_each_ranks_shard_shuffled_and_evaluating_it_warns(two_ranks):
    x, y = _data()  # 6 batches of 4, the last of 3: 3 per rank when training
    seen = []

    class Seen(keras.callbacks.Callback):  # opens fit's window as BroadcastState does (it needs collectives)
        def on_epoch_begin(self, epoch, logs=None):
            keras_reads.training_window(True)

        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

        def on_epoch_end(self, epoch, logs=None):
            keras_reads.training_window(False)

    with FastLoader(ArrayDataset(x, y, batch_size=4), training=True, workers=1, use_multiprocessing=False,
                    seed=5) as loader:
        assert len(loader) == 3
        assert loader.state_dict()["shuffle"] is True
        epoch = [tuple(b[1][:, 0].tolist()) for b in loader]
        shard = {tuple(y[4 * i:4 * i + 4, 0].tolist()) for i in (two_ranks, two_ranks + 2, two_ranks + 4)}
        assert set(epoch) == shard and epoch != sorted(epoch, key=lambda b: [tuple(y[:, 0]).index(b[0])])
        with warnings.catch_warnings():
            # Keras's JAX trainer looks at one batch before fit's callbacks begin: outside their window (a Horovod
            # job trains on TensorFlow, where nothing looks first).
            warnings.filterwarnings("ignore", message="A Keras call that kfast's callbacks did not report")
            _model().fit(loader, epochs=1, verbose=0, callbacks=[Seen()])
        assert seen == [0, 1, 2]
    with FastLoader(ArrayDataset(x, y, batch_size=4), training=True, workers=1, use_multiprocessing=False) as loader:
        with pytest.warns(UserWarning, match=f"reads its own shard \\(rank {two_ranks} here\\)"):
            _model().evaluate(loader, verbose=0)


def test_fit_on_whole_set_data_under_two_ranks_is_an_error_naming_the_fix(two_ranks):
    from kfast.callbacks import BroadcastState

    x, y = _data(16)
    state = BroadcastState()
    state.set_model(_model())
    before = keras_reads.whole_reads()
    state.on_epoch_begin(0)
    with FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False) as loader:
        loader.on_epoch_begin()  # what Keras's loop does at the epoch's start
        loader.on_epoch_end()
    assert keras_reads.whole_reads() == before + 1
    with pytest.raises(ValueError, match=r"FastLoader\(dataset, training=True\)"):
        state.on_epoch_end(0)


def test_fit_shuffle_never_reaches_the_loader_its_own_shuffle_and_class_weight_do():
    x, y = _data(16)
    labels = (y[:, 0] > 0).astype("int64")
    order = []

    class Look(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            order.append(batch)

    with FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False) as loader:
        assert [b[1].tolist() for b in loader] == [y[i:i + 4].tolist() for i in range(0, 16, 4)]  # index order
    with FastLoader(ArrayDataset(x, y, batch_size=4), training=True, shuffle=False, workers=1,
                    use_multiprocessing=False) as loader:
        assert [b[1].tolist() for b in loader] == [y[i:i + 4].tolist() for i in range(0, 16, 4)]
    weights = {0: 0.25, 1: 3.0}
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    start = model.get_weights()
    model.fit(x, labels, batch_size=4, shuffle=False, class_weight=weights, epochs=1, verbose=0)
    want = model.get_weights()
    model.set_weights(start)
    with FastLoader(ArrayDataset(x, labels, batch_size=4), workers=1, use_multiprocessing=False,
                    class_weight=weights) as loader:
        model.fit(loader, epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_sharded_dataset_passed_in_keeps_its_layout_and_a_keras_read_says_it_is_one_ranks(two_ranks):
    x, y = _data()
    shard = ShardedDataset(ArrayDataset(x, y, batch_size=4), rank=two_ranks, size=2, mode="all")
    with FastLoader(shard, workers=1, use_multiprocessing=False) as loader:
        assert len(loader) == 3
        with pytest.warns(UserWarning, match="each rank reads its own part"):
            _model().evaluate(loader, verbose=0)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_fit_reads_every_batch_once_whatever_the_steps_per_execution(steps_per_execution):
    if steps_per_execution > 1 and keras.backend.backend() == "torch":
        pytest.skip("Keras's PyTorch trainer takes steps_per_execution=1 only")
    # Keras 3.16 on JAX asks the adapter for several steps' batches stacked (get_jax_iterator(super_batch=...)).
    x, y = _data(32)
    want_model, got_model = _model(), _model()
    want_model.compile("sgd", "mse", jit_compile=False, steps_per_execution=steps_per_execution)
    got_model.compile("sgd", "mse", jit_compile=False, steps_per_execution=steps_per_execution)
    want_model.fit(x, y, batch_size=4, shuffle=False, epochs=2, verbose=0)
    with FastLoader(ArrayDataset(x, y, batch_size=4), workers=1, use_multiprocessing=False) as loader:
        got_model.fit(loader, epochs=2, verbose=0)
    for a, b in zip(got_model.get_weights(), want_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
