"""GPU state through NVML (the `nvidia-ml-py` package, imported as `pynvml`).

The one place kfast talks to NVML. `kfast doctor` lists GPUs with it and
`kfast.callbacks.GPUMonitor` samples one GPU with `Sampler`. Machines without an NVIDIA driver are
normal (CPU CI, laptops): every entry point raises `NvmlUnavailable` with a reason a person can act on,
never a raw NVML error.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_initialised = False


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says why and what to do."""


def _pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed, so GPUs cannot be read; fix: pip install nvidia-ml-py"
        ) from e
    return pynvml


def _init() -> ModuleType:
    """Initialise NVML once per process and return the module."""
    global _initialised
    pynvml = _pynvml()
    with _lock:
        if _initialised:
            return pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as e:
            raise NvmlUnavailable(
                "no NVIDIA driver on this machine (libnvidia-ml.so.1 not found); if it has an NVIDIA GPU, "
                "install the driver."
            ) from e
        except pynvml.NVMLError_DriverNotLoaded as e:
            raise NvmlUnavailable(
                "the NVIDIA driver is installed but not loaded; check `nvidia-smi` and reboot or "
                "load the kernel module."
            ) from e
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML failed to start: {e}") from e
        _initialised = True
    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version() -> str:
    """Returns the NVIDIA driver version string.

    Raises:
        NvmlUnavailable: when NVML cannot be used on this machine.
    """
    pynvml = _init()
    return _text(pynvml.nvmlSystemGetDriverVersion())


def list_gpus() -> list[dict[str, Any]]:
    """Describes every GPU NVML can see.

    Returns:
        A list of dicts with `index`, `name`, `memory_total_mib`, `memory_used_mib` and
        `utilization_percent` (the GPU's busy share over NVML's last sample period).

    Raises:
        NvmlUnavailable: when NVML cannot be used on this machine.

    Example:

    On a machine with an NVIDIA GPU and its driver (so not run as a doctest here):

    >>> for gpu in kfast.nvml.list_gpus():  # doctest: +SKIP
    ...     print(gpu["index"], gpu["name"], gpu["utilization_percent"])
    """
    pynvml = _init()
    gpus: list[dict[str, Any]] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(
            {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_total_mib": memory.total // 2**20,
                "memory_used_mib": memory.used // 2**20,
                "utilization_percent": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            }
        )
    return gpus


class Sampler:
    """Reads one GPU's utilisation and memory in use, one sample per call.

    Args:
        index: NVML index of the GPU (under Horovod, the local rank's GPU).

    Raises:
        NvmlUnavailable: when NVML cannot be used or the index does not exist.

    Example:

    On a machine with an NVIDIA GPU and its driver (so not run as a doctest here):

    >>> sample = kfast.nvml.Sampler(0)  # doctest: +SKIP
    >>> utilization_percent, memory_used_bytes = sample()  # doctest: +SKIP
    """

    def __init__(self, index: int = 0) -> None:
        pynvml = _init()
        count = pynvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise NvmlUnavailable(
                f"GPU index {index} requested but NVML sees {count} GPU(s); "
                "pass an index below that (usually the local rank)."
            )
        self._pynvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def __call__(self) -> tuple[float, int]:
        utilization = self._pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
        memory = self._pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
        return float(utilization), int(memory)
