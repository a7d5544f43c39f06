"""ThroughputMonitor: samples/s, step time and the share of time spent waiting for input, per epoch."""

from __future__ import annotations

from typing import Any

from kfast._core import callback_order
from kfast._core.epoch_clock import EpochClock


class ThroughputMonitor(EpochClock):
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

    def __init__(self, loader: Any = None, batch_size: int | None = None) -> None:
        if loader is not None and not hasattr(loader, "wait_seconds"):
            raise ValueError(f"ThroughputMonitor got loader={type(loader).__name__}; pass a kfast.data.FastLoader "
                             "(or batch_size= for any other data).")
        super().__init__(loader)
        self.batch_size = batch_size

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        callback_order.run_first(self)
        super().on_train_begin(logs)

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
