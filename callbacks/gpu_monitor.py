"""GPUMonitor: how busy the GPU was during each epoch, in `logs`."""

from __future__ import annotations

import math
import time
import warnings
import weakref
from typing import Any

import keras

from kfast._core.checks import check_number
from kfast._core import topology
from kfast._core import gpu_sampling
from kfast import nvml

# Seconds without a step beginning after which the sampling thread of a fit that raised stops (a module
# attribute, so tests can shorten it).
_IDLE_S = 600.0


class GPUMonitor(keras.callbacks.Callback):
    """Samples this process's GPU through NVML in a background thread and logs per-epoch statistics.

    Adds `gpu_util_mean`, `gpu_util_p10`, `gpu_idle_fraction` (share of samples under 10% busy) and
    `gpu_mem_used_max` (bytes) to each epoch's `logs`. History records them. Keras calls callbacks in list
    order, so a logger (CSVLogger, TensorBoard) records them when it comes after the monitor: list the
    monitors first, or pass the list through `kfast.callbacks.ordered`, which does that for you (as
    `kfast.distributed.default_callbacks` does); under Horovod, `MetricAverage` after them averages them
    over ranks. An epoch with no sample (shorter than `interval`) gets one reading taken at its end, and
    NaN if even that fails, so every epoch logs the same keys. A GPU that is often idle while training
    means the input pipeline cannot keep up. With no GPU or no driver it warns once (on rank 0), with the
    reason, and training goes on.

    The thread stops when training ends. A `fit` that raised never says it ended: the thread then stops
    once no training or validation step has begun for 10 minutes (a step that begins later starts it
    again), at once when the monitor is garbage-collected, and at the monitor's next `fit`. To tell, it
    notes the start of each step (`on_train_batch_begin`, `on_test_batch_begin`), which costs Keras none of
    its asynchronous dispatch (batch-end hooks would).

    Args:
        interval: seconds between samples. Defaults to `0.1`.
        sampler: a callable returning `(utilization_percent, memory_used_bytes)`. Defaults to `None`:
            NVML, on the GPU of this process's local rank.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> monitor = kfast.callbacks.GPUMonitor(sampler=lambda: (40.0, 2**30))  # without sampler=: NVML
    >>> logger = keras.callbacks.CSVLogger("gpu.csv")
    >>> history = model.fit(data, epochs=1, verbose=0, callbacks=kfast.callbacks.ordered([logger, monitor]))
    >>> history.history["gpu_util_mean"], history.history["gpu_mem_used_max"]
    ([40.0], [1073741824])
    >>> with open("gpu.csv") as f:
    ...     "gpu_util_mean" in f.readline().split(",")  # the logger after the monitor, by ordered
    True
    """

    _writes_epoch_logs = True  # kfast.callbacks.ordered puts it ahead of the loggers

    def __init__(self, interval: float = 0.1, sampler: gpu_sampling.Reader | None = None) -> None:
        super().__init__()
        check_number("GPUMonitor", "interval", interval, above=0, unit="seconds")
        self.interval = interval
        self._sampler = sampler
        self._thread: gpu_sampling.GpuSampler | None = None
        self._read: gpu_sampling.Reader | None = None
        self._warned = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.on_train_end()  # the thread of a fit that raised, if it still runs
        sampler = self._sampler
        if sampler is None:
            try:
                sampler = gpu_sampling.local_sampler()
            except nvml.NvmlUnavailable as e:
                if not self._warned and topology.is_chief():
                    warnings.warn(f"GPUMonitor is off: {e}", stacklevel=2)
                    self._warned = True
                return
        self._read = sampler
        # The thread holds the monitor weakly: a monitor dropped after a fit that raised ends it.
        owner = weakref.ref(self)
        self._thread = gpu_sampling.GpuSampler(sampler, self.interval, alive=lambda: owner() is not None,
                                               idle_after=_IDLE_S).start()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._thread is not None:
            self._thread.beat()
            self._thread.take()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._thread is not None:
            self._thread.beat()

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._thread is not None:
            self._thread.beat()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._thread is None or logs is None:
            return
        # The same keys every epoch, on every rank: MetricAverage exchanges values by name.
        samples = self._thread.take() or self._read_now()
        logs.update(gpu_sampling.summarize(samples) if samples else dict.fromkeys(gpu_sampling.KEYS, math.nan))

    def _read_now(self) -> list[gpu_sampling.Sample]:
        if self._read is None:
            return []
        try:
            util, mem = self._read()
        except Exception:  # noqa: BLE001 - a failing read costs this epoch's values, never training
            return []
        return [(time.monotonic(), util, mem)]

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
