"""A background thread that samples one GPU's utilisation and memory, and summaries of the samples."""

import sys
import threading
import time

import numpy as np

from kfast import nvml

# What `summarize` returns, in order.
KEYS = ("gpu_util_mean", "gpu_util_p10", "gpu_idle_fraction", "gpu_mem_used_max")


def summarize(samples):
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
        owner_thread: stop by itself once this thread, seen inside the function named `stop_when_left`,
            has left it (training that raised never calls on_train_end). Defaults to `None`.
        stop_when_left: name of the function whose frames mark "still training". Defaults to `"fit"`.
    """

    def __init__(self, sampler, interval=0.1, owner_thread=None, stop_when_left="fit"):
        self._sampler, self.interval = sampler, interval
        self._owner, self._marker = owner_thread, stop_when_left
        self._seen_inside = False
        self._lock = threading.Lock()
        self._samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kfast-gpu-sampler", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    @property
    def running(self):
        return self._thread.is_alive()

    def take(self):
        """Returns and clears the samples so far."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def _owner_left(self):
        """True once the owner thread, seen inside the marker function before, is no longer in it."""
        if self._owner is None:
            return False
        frame = sys._current_frames().get(self._owner)
        while frame is not None:
            if frame.f_code.co_name == self._marker:
                self._seen_inside = True
                return False
            frame = frame.f_back
        return self._seen_inside

    def _run(self):
        while not self._stop.is_set():
            try:
                util, mem = self._sampler()
            except Exception:  # noqa: BLE001 - a failing read ends sampling, never training
                return
            with self._lock:
                self._samples.append((time.monotonic(), util, mem))
            if self._owner_left():
                return
            self._stop.wait(self.interval)


def local_sampler():
    """Returns an NVML sampler for this process's GPU (the local rank's under Horovod).

    Raises:
        nvml.NvmlUnavailable: with the reason, when there is no usable GPU.
    """
    from kfast.distributed import _horovod as distributed

    return nvml.Sampler(distributed.local_rank())
