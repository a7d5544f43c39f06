"""`kfast.diagnose` and the user's data: read for no more passes than needed, left as it was found, changes
between passes named, and advice that names only what accepts the data given."""

import math

import keras
import numpy as np
import pytest

import kfast


def _model(width=4, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    return model


class ShrinksAtTheEnd(keras.utils.PyDataset):
    """As a Keras example does: serving the last, partial batch sets `self.batch_size` to what is left, so
    afterwards the dataset serves other batches (5 of 8 instead of 2 of 16 and 1 of 8) and another len()."""

    def __init__(self, samples=40, batch_size=16, **kwargs):
        super().__init__(**kwargs)
        self.samples, self.batch_size = samples, batch_size
        self.x = np.random.default_rng(0).normal(size=(samples, 4)).astype("float32")

    def __len__(self):
        return math.ceil(self.samples / self.batch_size)

    def __getitem__(self, i):
        start = i * self.batch_size
        if start + self.batch_size > self.samples:
            self.batch_size = self.samples - start
        x = self.x[start:start + self.batch_size]
        return x, x[:, :1]


def _served(data):
    return len(data), [tuple(data[i][0].shape) for i in range(len(data))]


def test_a_dataset_that_rebinds_its_attributes_while_serving_is_left_as_it_was_found():
    expected = _served(ShrinksAtTheEnd())
    assert expected == (3, [(16, 4), (16, 4), (8, 4)])
    data = ShrinksAtTheEnd()
    # Three passes and more over three batches; a budget no loaded machine reaches, as the count of timed steps is
    # asserted (under the default 20 s, make check's second worker once cut the compute phase at 6).
    d = kfast.diagnose(_model(), data, steps=8, warmup=1, budget_s=600)
    assert _served(data) == expected and data.batch_size == 8  # the look at the last batch shrank it again
    data.batch_size = 16
    assert _served(data) == expected
    assert [len(d.times[k]) for k in ("input", "compute", "end_to_end")] == [8, 8, 8]
    assert d.dataset_notes == ["ShrinksAtTheEnd rebinds batch_size (16 -> 8) while serving; diagnose put it back "
                               "after each pass and at the end"]
    assert "Dataset:\n  - ShrinksAtTheEnd rebinds batch_size (16 -> 8)" in str(d)
    assert "leave self as it was in __getitem__" in d.recommendations[0]
    assert d.to_dict()["dataset_notes"] == d.dataset_notes


class GrowsInPlace(keras.utils.PyDataset):
    """Its last batch gains a sample each time it is served, through a list changed in place (nothing to
    put back): its batches change between passes."""

    def __init__(self, n=3, **kwargs):
        super().__init__(**kwargs)
        self.n, self.served_last = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.n - 1:
            self.served_last.append(i)
        rows = 4 + (len(self.served_last) if i == self.n - 1 else 0)
        x = np.ones((rows, 4), "float32")
        return x, x[:, :1]


def test_batches_that_change_between_passes_are_noticed_and_named():
    d = kfast.diagnose(_model(), GrowsInPlace(), steps=8, warmup=1)
    assert len(d.dataset_notes) == 1 and d.dataset_notes[0].startswith(
        "GrowsInPlace's batches change between passes (shapes of the same batch: batch 2: ((5, 4), (5, 1)) in "
        "pass 1, ((6, 4), (6, 1)) in pass 2; ")
    assert "training for several epochs sees the changed batches too" in d.dataset_notes[0]
    assert "leave self as it was" in d.recommendations[0]


def test_an_unchanging_dataset_gets_no_dataset_notes():
    d = kfast.diagnose(_model(), Counted(n=4), steps=6, warmup=1)
    assert d.dataset_notes == [] and "Dataset:" not in str(d)


class Counted(keras.utils.PyDataset):
    """Records the index of every batch served (in place, so nothing is put back)."""

    def __init__(self, n=4, **kwargs):
        super().__init__(**kwargs)
        self.n, self.reads = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads.append(i)
        x = np.full((8, 4), i, "float32")
        return x, x[:, :1]


def test_a_short_dataset_is_read_for_the_passes_the_phases_need_and_no_more():
    model = _model()
    model.fit(Counted(), epochs=1, verbose=0)  # built, compiled metrics too: what fit reads below is its own
    plain = Counted()
    model.fit(plain, epochs=2, verbose=0)  # the 8 steps of the end-to-end phase, as training reads them
    data = Counted()
    d = kfast.diagnose(model, data, steps=6, warmup=2)  # 8 batches a phase over 4: two passes
    assert len(d.times["input"]) == len(d.times["end_to_end"]) == 6
    # The input phase reads indices 0-3 twice, in order; the end-to-end phase what two epochs of fit read.
    assert data.reads[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert sorted(data.reads[8:]) == sorted(plain.reads)


def test_tf_data_input_is_advised_kfast_tune_and_tf_data_knobs_not_fastloader():
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a tf.data pipeline feeds fit on the TensorFlow backend")

    def slow(x, y):  # 20 ms of Python per batch, in tf.data's one thread: the pipeline is the limit
        import time

        def wait(v):
            time.sleep(0.02)
            return v

        return tf.ensure_shape(tf.numpy_function(wait, [x], tf.float32), x.shape), y

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    pipeline = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).map(slow)
    d = kfast.diagnose(_model(), pipeline, steps=6, warmup=1)
    assert d.verdict == "input-bound", str(d)
    assert d.recommendations[0].endswith(": let kfast.tune(dataset, model=model) tune the pipeline, or set "
                                         "tf.data's own knobs: map(..., num_parallel_calls=tf.data.AUTOTUNE) for "
                                         "the per-element work and .prefetch(tf.data.AUTOTUNE) at the end.")
    assert not any("FastLoader" in r for r in d.recommendations)
    assert d.dataset_notes == []  # a tf.data pipeline is not Python state to put back


def test_a_slow_pydataset_is_advised_fastloader():
    class Slow(Counted):
        def __getitem__(self, i):
            import time

            time.sleep(0.02)
            return super().__getitem__(i)

    # Twelve steps make six stretches, so one step stretched by another process (CI's other test worker) moves
    # one stretch and not the interquartile range; with six steps it made the verdict "uncertain".
    d = kfast.diagnose(_model(), Slow(n=12), steps=12, warmup=1)
    assert d.verdict == "input-bound", str(d)
    assert "wrap the dataset in kfast.data.FastLoader(dataset, workers=" in d.recommendations[0]
