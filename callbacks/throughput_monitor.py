"""ThroughputMonitor: samples/s, step time and the share of time spent waiting for input, per epoch."""

import time

import keras


class ThroughputMonitor(keras.callbacks.Callback):
    """Adds `steps_per_second`, `step_time`, `samples_per_second` and `input_wait_fraction` to epoch logs.

    It uses epoch hooks only (no per-batch work, so Keras keeps its asynchronous dispatch). With a kfast
    `FastLoader` passed as `loader`, samples are counted exactly and `input_wait_fraction` is the share of
    the epoch the training loop spent blocked waiting for the next batch: near 0 means the input keeps
    up, large means the model is starved. Without a loader, pass `batch_size` for samples/s.

    Args:
        loader: the `FastLoader` feeding `fit`. Defaults to `None`.
        batch_size: samples per batch when there is no loader. Defaults to `None`.

    Example:

    >>> loader = kfast.data.FastLoader(dataset)  # doctest: +SKIP
    >>> model.fit(loader, callbacks=[kfast.callbacks.ThroughputMonitor(loader)])  # doctest: +SKIP
    """

    def __init__(self, loader=None, batch_size=None):
        super().__init__()
        if loader is not None and not hasattr(loader, "wait_seconds"):
            raise ValueError(f"ThroughputMonitor got loader={type(loader).__name__}; pass a kfast.data.FastLoader "
                             "(or batch_size= for any other data).")
        self.loader, self.batch_size = loader, batch_size

    def on_train_begin(self, logs=None):
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        if self.loader is not None:
            self._wait0, self._samples0 = self.loader.wait_seconds, self.loader.samples_served

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._start is None:
            return
        elapsed = time.perf_counter() - self._start
        steps = self.params.get("steps") or 0
        if steps:
            logs["steps_per_second"] = steps / elapsed
            logs["step_time"] = elapsed / steps
        if self.loader is not None:
            logs["samples_per_second"] = (self.loader.samples_served - self._samples0) / elapsed
            logs["input_wait_fraction"] = min(1.0, (self.loader.wait_seconds - self._wait0) / elapsed)
        elif self.batch_size and steps:
            logs["samples_per_second"] = steps * self.batch_size / elapsed
