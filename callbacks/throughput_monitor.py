"""ThroughputMonitor: samples/s, step time and the share of time spent waiting for input, per epoch."""

import time

import keras

from kfast._core import callback_order

# The clock, a module attribute so tests can script time without touching the signature.
_clock = time.perf_counter


class ThroughputMonitor(keras.callbacks.Callback):
    """Adds `steps_per_second`, `step_time`, `samples_per_second` and `input_wait_fraction` to epoch logs.

    It uses epoch hooks only (no per-batch work, so Keras keeps its asynchronous dispatch). With a kfast
    `FastLoader` passed as `loader`, samples are counted exactly and `input_wait_fraction` is the share of
    the epoch the training loop spent blocked waiting for the next batch: near 0 means the input keeps
    up, large means the model is starved. Without a loader, pass `batch_size` for samples/s.

    Only training steps count: the epoch's clock stops when validation begins (Keras validates before
    `on_epoch_end`), so `validation_data` does not dilute the rates.

    History, CSVLogger and TensorBoard record the values wherever the monitor sits in the callback list:
    when training begins it moves itself (with kfast's other monitors) to the front of the list, so its
    values are in `logs` before any other callback's `on_epoch_end` reads them. Under Horovod,
    `MetricAverage` therefore averages them over ranks, like the loss.

    Args:
        loader: the `FastLoader` feeding `fit`. Defaults to `None`.
        batch_size: samples per batch when there is no loader. Defaults to `None`.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> with kfast.data.FastLoader(data, use_multiprocessing=False) as loader:
    ...     history = model.fit(loader, verbose=0, callbacks=[kfast.callbacks.ThroughputMonitor(loader)])
    >>> sorted(key for key in history.history if key != "loss")
    ['input_wait_fraction', 'samples_per_second', 'step_time', 'steps_per_second']
    """

    _writes_epoch_logs = True  # kfast._core.callback_order.run_first puts it ahead of the loggers

    def __init__(self, loader=None, batch_size=None):
        super().__init__()
        if loader is not None and not hasattr(loader, "wait_seconds"):
            raise ValueError(f"ThroughputMonitor got loader={type(loader).__name__}; pass a kfast.data.FastLoader "
                             "(or batch_size= for any other data).")
        self.loader, self.batch_size = loader, batch_size

    def on_train_begin(self, logs=None):
        callback_order.run_first(self)
        self._start = None
        self._train_end = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._train_end = _clock(), None
        if self.loader is not None:
            self._wait0, self._samples0 = self.loader.wait_seconds, self.loader.samples_served

    def _stop_clock(self):
        if self._train_end is None:
            self._train_end = _clock()
            if self.loader is not None:
                self._wait1, self._samples1 = self.loader.wait_seconds, self.loader.samples_served

    def on_test_begin(self, logs=None):
        if self._start is not None:  # validation inside fit's epoch; a standalone evaluate() has no epoch
            self._stop_clock()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._start is None:
            return
        self._stop_clock()
        elapsed = self._train_end - self._start
        self._start = None
        steps = self.params.get("steps") or 0
        if steps:
            logs["steps_per_second"] = steps / elapsed
            logs["step_time"] = elapsed / steps
        if self.loader is not None:
            logs["samples_per_second"] = (self._samples1 - self._samples0) / elapsed
            logs["input_wait_fraction"] = min(1.0, (self._wait1 - self._wait0) / elapsed)
        elif self.batch_size and steps:
            logs["samples_per_second"] = steps * self.batch_size / elapsed
