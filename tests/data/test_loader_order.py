"""A FastLoader's order is its own (issues 25, 46): training data (`training=True`) is shuffled each epoch,
anything else read in index order, in `fit`, `evaluate`, `predict` and a plain loop alike; `shuffle=` fixes it
either way, and `fit(shuffle=...)` never reaches the loader (Keras passes its own data adapter through)."""

import keras
import numpy as np
import pytest

from kfast.data import ArrayDataset
from kfast.data import FastLoader

N = 8  # batches per epoch; batch b holds samples 2b and 2b + 1


class Recorder(keras.layers.Layer):
    """Notes the batch index of every concrete batch the model is called on (the model runs eagerly)."""

    def __init__(self, seen):
        super().__init__()
        self.note = seen.append  # a bound method: Keras would copy a list attribute into a tracked one

    def call(self, x):
        try:
            self.note(int(keras.ops.convert_to_numpy(x)[0, 0]) // 2)
        except Exception:  # a symbolic call (Keras building the model) has no values
            pass
        return x


def _model(seen):
    model = keras.Sequential([keras.Input((1,)), Recorder(seen), keras.layers.Dense(1)])
    model.compile("sgd", "mse", run_eagerly=True)
    return model


def _data():
    x = np.arange(2 * N, dtype="float32").reshape(-1, 1)
    return ArrayDataset(x, x, batch_size=2)


def _epochs(seen, epochs):
    """The last `epochs` epochs' batch orders (a backend that builds from one batch first adds one more)."""
    return [seen[len(seen) - (epochs - e) * N:len(seen) - (epochs - e - 1) * N] for e in range(epochs)]


def _fit_orders(epochs=3, processes=False, fit_kwargs=None, training=True, **loader_kwargs):
    seen = []
    with FastLoader(_data(), training=training, workers=2, use_multiprocessing=processes, **loader_kwargs) as loader:
        _model(seen).fit(loader, epochs=epochs, verbose=0, **(fit_kwargs or {}))
    return _epochs(seen, epochs)


@pytest.mark.parametrize("processes", [pytest.param(False, id="threads"), pytest.param(True, id="processes")])
def test_fit_shuffles_each_epoch_anew_in_the_order_the_seed_fixes(processes):
    orders = _fit_orders(processes=processes, seed=7)
    assert all(sorted(order) == list(range(N)) for order in orders), orders
    assert len({tuple(order) for order in orders}) == 3, f"an epoch repeated another's order: {orders}"
    assert _fit_orders(processes=processes, seed=7) == orders
    assert _fit_orders(processes=processes, seed=8) != orders


def test_fit_shuffle_never_reaches_the_loader_and_other_data_keeps_index_order():
    assert _fit_orders(fit_kwargs={"shuffle": False}, seed=7) == _fit_orders(seed=7) != [list(range(N))] * 3
    assert _fit_orders(training=False, seed=7) == [list(range(N))] * 3


def test_the_loaders_own_shuffle_false_wins_over_fits_default():
    assert _fit_orders(shuffle=False, seed=7) == [list(range(N))] * 3


def test_the_loaders_own_shuffle_true_wins_over_fit_shuffle_false():
    orders = _fit_orders(shuffle=True, seed=7, fit_kwargs={"shuffle": False})
    assert orders == _fit_orders(shuffle=True, seed=7) != [list(range(N))] * 3


def test_evaluate_and_predict_on_data_that_is_not_training_data_read_in_index_order():
    seen = []
    model = _model(seen)
    with FastLoader(_data(), training=True, workers=2, use_multiprocessing=False, seed=3) as loader:
        model.fit(loader, epochs=2, verbose=0)
        assert _epochs(seen, 1)[0] != list(range(N))  # seed 3 shuffles both epochs: not in order by chance
    with FastLoader(_data(), workers=2, use_multiprocessing=False, seed=3) as loader:
        del seen[:]
        model.evaluate(loader, verbose=0)
        assert seen == list(range(N))
        del seen[:]
        predictions = model.predict(loader, verbose=0)
        assert seen == list(range(N))
        assert predictions.shape == (2 * N, 1)
        assert [[y.tolist() for _, y in loader]][0] == [[[2.0 * b], [2.0 * b + 1]] for b in range(N)]


def test_a_plain_loop_is_in_index_order_and_shuffle_must_be_a_bool():
    with FastLoader(_data(), workers=1, use_multiprocessing=False) as loader:
        assert [int(x[0, 0]) // 2 for x, _ in loader] == list(range(N))
    with pytest.raises(ValueError, match=r"shuffle='yes'.*True, False, or None"):
        FastLoader(_data(), shuffle="yes")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="kfast.distributed trains through TensorFlow's collectives; the TensorFlow run covers it")
def test_elastic_fit_reads_each_epoch_in_the_datasets_order():
    # Its commits count positions in the epoch's order, the same on every rank: a loader shuffling by fit's
    # default would skip and repeat batches after a membership change (found by tests/multihost/test_elastic.py).
    import kfast

    seen = []
    model = keras.Sequential([keras.Input((1,)), Recorder(seen), keras.layers.Dense(1)])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", run_eagerly=True)
    kfast.distributed.elastic_fit(model, _data(), epochs=2, commit_every=4, use_multiprocessing=False, verbose=0)
    assert _epochs(seen, 2) == [list(range(N))] * 2
