"""A stand-in accelerator and datasets with a known load time, to check `kfast.diagnose` against a truth.

`FixedStep` is a Keras layer whose every call waits a fixed wall time inside fit's compiled step without
using the host's CPU (a sleep, run by the backend's own host-callback op), as a GPU's step leaves the host
free while it computes. `Paced` is a PyDataset whose source yields one batch every `every` seconds, however
many of Keras's worker threads ask (they wait for their turn, asleep), so training is offered a batch every
`every` seconds while the model computes, and reading it alone takes as long. `Loading` takes a fixed time
per batch in each thread, so two threads deliver in bursts. From a model's step and the pace, the share of
each step spent waiting for input is known: `wait_share`.
"""

import threading
import time

import keras
import numpy as np


def _wait_op(seconds):
    """An op of the current backend that sleeps `seconds` when the compiled step runs and returns 0.0."""
    backend = keras.backend.backend()

    def sleep():
        time.sleep(seconds)
        return np.float32(0.0)

    if backend == "tensorflow":
        import tensorflow as tf

        def wait():
            out = tf.py_function(sleep, [], tf.float32)
            out.set_shape(())
            return out

        return wait
    if backend == "jax":
        import jax
        from jax.experimental import io_callback

        # io_callback, not pure_callback: an op with no inputs that is called "pure" may be run once.
        return lambda: io_callback(sleep, jax.ShapeDtypeStruct((), np.float32))
    return lambda: keras.ops.convert_to_tensor(sleep())  # PyTorch runs the train step eagerly


class FixedStep(keras.layers.Layer):
    """Adds 0 to its input after waiting `seconds`: the step takes that long, the host's cores stay idle."""

    def __init__(self, seconds, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds
        self._wait = _wait_op(seconds)

    def call(self, x):
        return x + keras.ops.cast(self._wait(), x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape


def fixed_step_model(seconds, width=4, seed=0):
    """A compiled model whose training step takes about `seconds` of wall time, the host idle meanwhile."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((width,)), FixedStep(seconds), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse", jit_compile=False)
    return model


class _Stamps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.stamps = []

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append(time.perf_counter())


class _Ready(keras.utils.PyDataset):
    def __init__(self, x, n, workers):
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=10)
        self.x, self.n = x, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x, self.x[:, :1]


def step_seconds(model, workers=2, steps=12, warmup=3):
    """The model's own training step when every batch is ready, timed by a plain fit (no diagnose) on
    batches served as `Paced` and `Loading` serve them (Keras's `workers` threads): the stand-in's wait
    plus what Keras adds to each step on this machine. The median: these steps do not come in bursts, and
    one stretched by another process must not move the truth."""
    x = np.zeros((8, model.inputs[0].shape[1]), "float32")
    clock = _Stamps()
    model.fit(_Ready(x, warmup + steps, workers), epochs=1, shuffle=False, verbose=0, callbacks=[clock])
    return float(np.median(np.diff(clock.stamps[warmup - 1:])))


def wait_share(load_every, step):
    """The share of each training step spent waiting for input when a batch arrives every `load_every`
    seconds and the model's step takes `step` seconds (loading overlaps computing)."""
    return max(0.0, load_every - step) / max(load_every, step)


class Paced(keras.utils.PyDataset):
    """`n` batches of 8 x `width` features from a source that yields one every `every` seconds, read ahead
    by `workers` of Keras's threads (each waits, asleep, for the next free turn)."""

    def __init__(self, every, n=40, width=4, workers=2):
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=10)
        self.every, self.n = every, n
        self.x = np.random.default_rng(0).normal(size=(8, width)).astype("float32")
        # In place, not rebound: the pace is the source's, not state diagnose should put back.
        self._turn, self._lock = [0.0], threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self._lock:
            now = time.perf_counter()
            turn = max(now, self._turn[0] + self.every)
            self._turn[0] = turn
        time.sleep(turn - now)
        return self.x, self.x[:, :1]


class Loading(keras.utils.PyDataset):
    """`n` batches of 8 x `width` features, each taking `seconds` to load (a sleep: the cores stay idle),
    loaded by `workers` of Keras's threads: a batch is ready every `seconds / workers` at best."""

    def __init__(self, seconds, n=40, width=4, workers=2, max_queue_size=10):
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=max_queue_size)
        self.seconds, self.n = seconds, n
        self.x = np.random.default_rng(0).normal(size=(8, width)).astype("float32")

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return self.x, self.x[:, :1]
