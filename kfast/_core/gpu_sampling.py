"""A background thread that samples one GPU's utilisation and memory, and summaries of the samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from kfast import nvml

# What `summarize` returns, in order.
KEYS = ("gpu_util_mean", "gpu_util_p10", "gpu_idle_fraction", "gpu_mem_used_max")


Sample = tuple[float, float, int]  # (monotonic time, utilisation %, memory used in bytes)
Reader = Callable[[], tuple[float, int]]


def summarize(samples: Sequence[Sample]) -> dict[str, float]:
    """Summarises `(time, utilization_percent, memory_used_bytes)` samples.

    Returns:
        A dict with `gpu_util_mean`, `gpu_util_p10`, `gpu_idle_fraction` (share of samples under 10%
        busy) and `gpu_mem_used_max` (bytes); empty when there are no samples.

    Example:

    >>> summarize([(0, 0, 1), (1, 90, 5), (2, 0, 2), (3, 90, 3)])["gpu_idle_fraction"]
    0.5
    """
    if not samples:
        return {}
    util = np.array([s[1] for s in samples], dtype="float64")
    return {"gpu_util_mean": float(util.mean()), "gpu_util_p10": float(np.percentile(util, 10)),
            "gpu_idle_fraction": float((util < 10).mean()), "gpu_mem_used_max": int(max(s[2] for s in samples))}


class GpuSampler:
    """Calls `sampler()` every `interval` seconds on a daemon thread and keeps the readings.

    Args:
        sampler: a callable returning `(utilization_percent, memory_used_bytes)`, e.g. `nvml.Sampler(i)`;
            tests inject scripted ones.
        interval: seconds between samples.
        alive: called between samples; once it returns False the thread stops by itself (a `fit` that
            raised never calls `on_train_end`: see `callback_order`). Defaults to `None`: until `stop()`.
    """

    def __init__(self, sampler: Reader, interval: float = 0.1, alive: Callable[[], bool] | None = None) -> None:
        self._sampler, self.interval = sampler, interval
        self._alive = alive
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kfast-gpu-sampler", daemon=True)

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def take(self) -> list[Sample]:
        """Returns and clears the samples so far."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                util, mem = self._sampler()
            except Exception:  # noqa: BLE001 - a failing read ends sampling, never training
                return
            with self._lock:
                self._samples.append((time.monotonic(), util, mem))
            if self._alive is not None and not self._alive():
                return
            self._stop.wait(self.interval)


def local_sampler() -> Reader:
    """Returns an NVML sampler for this process's GPU (the local rank's under Horovod).

    Raises:
        nvml.NvmlUnavailable: with the reason, when there is no usable GPU.
    """
    from kfast.distributed import _horovod as distributed

    return nvml.Sampler(distributed.local_rank())
