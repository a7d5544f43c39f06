"""A background thread that samples one GPU's utilisation and memory, and summaries of the samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from kfast._core import topology
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

    The thread ends at `stop()`, when a read raises, when `alive()` says False, or when `idle_after` seconds
    pass without a `beat()`; the next `beat()` then starts it again (a `fit` that raised never calls
    `on_train_end`, and its monitor beats no more: see `GPUMonitor`).

    Args:
        sampler: a callable returning `(utilization_percent, memory_used_bytes)`, e.g. `nvml.Sampler(i)`;
            tests inject scripted ones.
        interval: seconds between samples. Defaults to `0.1`.
        alive: called between samples; once it returns False the thread ends for good. Defaults to `None`.
        idle_after: seconds without a `beat()` after which the thread ends until the next one. Defaults to
            `None`: never.
    """

    def __init__(self, sampler: Reader, interval: float = 0.1, alive: Callable[[], bool] | None = None,
                 idle_after: float | None = None) -> None:
        self._sampler, self.interval = sampler, interval
        self._alive, self._idle_after = alive, idle_after
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._beat = time.monotonic()
        self.idle = False  # the thread ended for want of beats; the next beat starts it again
        self._thread = self._new_thread()

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name="kfast-gpu-sampler", daemon=True)

    def start(self) -> GpuSampler:
        self._beat = time.monotonic()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Says the training that reads the samples goes on; starts the thread again if it went idle."""
        self._beat = time.monotonic()
        if self.idle and not self._stop.is_set():
            self.idle = False
            self._thread = self._new_thread()
            self._thread.start()

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
            if self._idle_after is not None and time.monotonic() - self._beat > self._idle_after:
                self.idle = True
                return
            self._stop.wait(self.interval)


def local_sampler() -> Reader:
    """Returns an NVML sampler for this process's GPU (the local rank's under Horovod).

    Raises:
        nvml.NvmlUnavailable: with the reason, when there is no usable GPU.
    """
    return nvml.Sampler(topology.local_rank())
