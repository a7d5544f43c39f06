"""ThroughputMonitor: samples/s, step time and the share of time spent waiting for input, per epoch."""

from __future__ import annotations

from typing import Any

from kfast._core import tf_datasets
from kfast._core.epoch_clock import EpochClock


class ThroughputMonitor(EpochClock):
    """Adds `steps_per_second`, `step_time`, `samples_per_second` and `input_wait_fraction` to epoch logs.

    It uses epoch hooks only (no per-batch work, so Keras keeps its asynchronous dispatch). With a kfast
    `FastLoader` passed as `loader`, samples are counted exactly and `input_wait_fraction` is the share of
    the epoch's training time spent blocked waiting for the next batch: near 0 means the input keeps up,
    large means the model is starved. Without a loader, pass `batch_size` for samples/s.

    `input_wait_fraction` is the input wait part of kfast's one accounting of a step (compute, input
    wait, other: hand-off, conversion, framework), under the name `kfast.diagnose` prints it; the rest,
    `1 - input_wait_fraction`, is compute and other together, which only `kfast.diagnose` tells apart (it
    times the model alone). The wait is read from the loader's own counter, so it is the wait of whoever
    reads the loader: on TensorFlow, Keras reads it from a prefetching thread, whose wait also covers the
    model's compute when the input is the limit; there the share is an upper bound of the step's.

    A `tf.data.Dataset` may be passed as `loader` too. Samples/s then counts `steps x batch size`, the
    batch size read from the dataset's `element_spec` when it fixes one (`batch(n, drop_remainder=True)`),
    else taken from `batch_size`, else not logged (a plain `batch(n)` leaves the size unknown, and a short
    last batch counts as a full one). `input_wait_fraction` is not logged for a `tf.data.Dataset`: the
    wait happens inside TensorFlow's iterator, out of sight of Python and of this callback, and kfast
    will not log a guess (TensorBoard's profiler, `keras.callbacks.TensorBoard(profile_batch=...)`, shows
    the pipeline's own timeline).

    Only training steps count: the epoch's clock stops when validation begins (Keras validates before
    `on_epoch_end`), so `validation_data` does not dilute the rates.

    History records the values. Keras calls callbacks in list order, so a logger (CSVLogger, TensorBoard)
    records them when it comes after the monitor: list the monitors first, or pass the list through
    `kfast.callbacks.ordered`, which does that for you (as `kfast.distributed.default_callbacks` does).
    Under Horovod, `MetricAverage` after them averages them over ranks, like the loss.

    Args:
        loader: the `FastLoader` or `tf.data.Dataset` feeding `fit`. Defaults to `None`.
        batch_size: samples per batch when there is no loader, or when a `tf.data.Dataset`'s spec does
            not fix it. Defaults to `None`.

    Raises:
        ValueError: for a `loader` that is neither, or a `batch_size` that contradicts the batch size the
            `tf.data.Dataset` fixes.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> with kfast.data.FastLoader(data, use_multiprocessing=False) as loader:
    ...     monitor = kfast.callbacks.ThroughputMonitor(loader)
    ...     csv = keras.callbacks.CSVLogger("log.csv")
    ...     history = model.fit(loader, verbose=0, callbacks=kfast.callbacks.ordered([csv, monitor]))
    >>> sorted(key for key in history.history if key != "loss")
    ['input_wait_fraction', 'samples_per_second', 'step_time', 'steps_per_second']
    >>> with open("log.csv") as f:
    ...     "input_wait_fraction" in f.readline().split(",")  # the logger after the monitor, by ordered
    True

    With a `tf.data.Dataset` whose batches all hold 16 samples:

    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.from_tensor_slices((np.ones((64, 4)), np.ones(64))).batch(16, drop_remainder=True)
    >>> monitor = kfast.callbacks.ThroughputMonitor(ds)
    >>> history = model.fit(ds, verbose=0, shuffle=False, callbacks=[monitor])  # a tf.data.Dataset shuffles itself
    >>> sorted(key for key in history.history if key != "loss")
    ['samples_per_second', 'step_time', 'steps_per_second']
    """

    _writes_epoch_logs = True  # kfast.callbacks.ordered puts it ahead of the loggers

    def __init__(self, loader: Any = None, batch_size: int | None = None) -> None:
        if tf_datasets.is_tf_dataset(loader):
            fixed = tf_datasets.static_batch_size(loader)
            if fixed is not None and batch_size is not None and batch_size != fixed:
                raise ValueError(f"ThroughputMonitor got batch_size={batch_size!r} with a tf.data.Dataset whose "
                                 f"batches hold {fixed} samples each (its element_spec); drop batch_size, or "
                                 "pass the dataset that feeds fit.")
            # The epoch clock reads no counters from it: a tf.data pipeline keeps none that Python can see.
            super().__init__(None)
            self.batch_size = fixed or batch_size
            return
        if loader is not None and not hasattr(loader, "wait_seconds"):
            raise ValueError(f"ThroughputMonitor got loader={type(loader).__name__}; pass a kfast.data.FastLoader "
                             "or a tf.data.Dataset (or batch_size= for any other data).")
        super().__init__(loader)
        self.batch_size = batch_size

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        span = self.epoch_span()
        if logs is None or span is None:
            return
        steps = self.params.get("steps") or 0
        if steps:
            logs["steps_per_second"] = steps / span.seconds
            logs["step_time"] = span.seconds / steps
        if self.loader is not None:
            logs["samples_per_second"] = span.samples / span.seconds
            logs["input_wait_fraction"] = span.input_wait_fraction
        elif self.batch_size and steps:
            logs["samples_per_second"] = steps * self.batch_size / span.seconds
