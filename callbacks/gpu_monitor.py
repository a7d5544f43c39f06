"""GPUMonitor: how busy the GPU was during each epoch, in `logs`."""

from __future__ import annotations

import math
from typing import Any
import time
import warnings

import keras

from kfast._core.checks import check_number
from kfast._core import callback_order
from kfast.distributed import _horovod as distributed
from kfast._core import gpu_sampling
from kfast import nvml


class GPUMonitor(keras.callbacks.Callback):
    """Samples this process's GPU through NVML in a background thread and logs per-epoch statistics.

    Adds `gpu_util_mean`, `gpu_util_p10`, `gpu_idle_fraction` (share of samples under 10% busy) and
    `gpu_mem_used_max` (bytes) to each epoch's `logs`. History, CSVLogger and TensorBoard record them
    wherever the monitor sits in the callback list: when training begins it moves itself (with kfast's
    other monitors) to the front of the list, so the values are in `logs` before any logger reads them;
    under Horovod, `MetricAverage` averages them over ranks. An epoch with no sample (shorter than
    `interval`) gets one reading taken at its end, and NaN if even that fails, so every epoch logs the
    same keys. A GPU that is often idle while training means the input pipeline cannot keep up. With no
    GPU or no driver it warns once (on rank 0), with the reason, and training goes on. The thread stops
    when training ends, also when training raises.

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
    >>> history = model.fit(data, epochs=1, verbose=0, callbacks=[monitor])
    >>> history.history["gpu_util_mean"], history.history["gpu_mem_used_max"]
    ([40.0], [1073741824])
    """

    _writes_epoch_logs = True  # kfast._core.callback_order.run_first puts it ahead of the loggers

    def __init__(self, interval: float = 0.1, sampler: gpu_sampling.Reader | None = None) -> None:
        super().__init__()
        check_number("GPUMonitor", "interval", interval, above=0, unit="seconds")
        self.interval = interval
        self._sampler = sampler
        self._thread: gpu_sampling.GpuSampler | None = None
        self._read: gpu_sampling.Reader | None = None
        self._warned = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        lists = callback_order.run_first(self)
        sampler = self._sampler
        if sampler is None:
            try:
                sampler = gpu_sampling.local_sampler()
            except nvml.NvmlUnavailable as e:
                if not self._warned and distributed.is_chief():
                    warnings.warn(f"GPUMonitor is off: {e}", stacklevel=2)
                    self._warned = True
                return
        self._read = sampler
        # Sampling ends with the fit that started it, also one that raised (and so never calls on_train_end).
        alive = (lambda: any(ref() is not None for ref in lists)) if lists else None
        self._thread = gpu_sampling.GpuSampler(sampler, self.interval, alive=alive).start()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._thread is not None:
            self._thread.take()

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
