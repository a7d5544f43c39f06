"""The Horovod engine: Horovod's start-up, its topology and its collectives, for Keras on TensorFlow.

This is the only kfast module that imports Horovod, and it speaks only Horovod: the choice of engine, the
single-process fallback and the public functions live in the router, `kfast.distributed.collectives`,
which calls `init()` here when the job runs on Horovod. `init()` starts Horovod and makes its topology the
current one in `kfast._core.topology`, which owns rank, size and whether the job started. This module
imports only that topology of kfast.

kfast uses the collectives of `horovod.tensorflow` (allreduce, broadcast) directly: Horovod's own Keras
layer (`horovod.tensorflow.keras`) does not work with Keras 3.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from kfast._core import topology

INSTALL_HINT = (
    "install Horovod built for your TensorFlow with `bash scripts/install_horovod.sh` "
    "(or `make test`, which runs it), see README"
)
_hvd: Any = None  # horovod.tensorflow, once init() started it


class _HorovodTopology:
    """Horovod's rank and size (a `kfast._core.topology.Topology`), asked live: an elastic job's change
    when its ring re-forms."""

    def __init__(self, hvd: Any) -> None:
        self.hvd = hvd

    def rank(self) -> int:
        return int(self.hvd.rank())

    def size(self) -> int:
        return int(self.hvd.size())

    def local_rank(self) -> int:
        return int(self.hvd.local_rank())

    def local_size(self) -> int:
        return int(self.hvd.local_size())


class HorovodCollectives:
    """Two or more ranks: Horovod's TensorFlow collectives (a `kfast.distributed.collectives.Collectives`)."""

    def __init__(self, hvd: Any) -> None:
        self.hvd = hvd

    def allreduce_average(self, tensors: Sequence[Any], name: str | None) -> list[Any]:
        present = [i for i, t in enumerate(tensors) if t is not None]
        reduced = self.hvd.grouped_allreduce([tensors[i] for i in present], op=self.hvd.Average, name=name)
        out = list(tensors)
        for i, t in zip(present, reduced):
            out[i] = t
        return out

    def broadcast_variables(self, variables: Iterable[Any], root_rank: int) -> None:
        for i, v in enumerate(variables):
            v.assign(self.hvd.broadcast(v.value, root_rank, name=f"kfast.bcast.{i}"))

    def broadcast_object(self, obj: Any, root_rank: int) -> Any:
        return self.hvd.broadcast_object(obj, root_rank)

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self.hvd.allgather_object(obj))

    def allreduce_mean_values(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in self._allreduce(values, self.hvd.Average, "kfast.values")]

    def allreduce_sum_values(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in self._allreduce(values, self.hvd.Sum, "kfast.sums")]

    def allreduce_max_ints(self, values: Sequence[int]) -> list[int]:
        # float64 holds these small ints exactly, and takes the path the two above take on every device.
        return [int(v) for v in self._allreduce([float(v) for v in values], self.hvd.Max, "kfast.max")]

    def _allreduce(self, values: Sequence[float], op: Any, name: str) -> Any:
        import tensorflow as tf

        return self.hvd.allreduce(tf.constant(values, dtype=tf.float64), op=op, name=name).numpy()


def launched() -> bool:
    """Whether `horovodrun` (or `mpirun`) started this process."""
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def started() -> bool:
    """Whether `init()` started Horovod in this process."""
    return _hvd is not None


def horovodrun_path() -> str:
    """The `horovodrun` on PATH, else the one beside this Python (a virtualenv's bin/ that is not on PATH)."""
    return shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")


def import_horovod() -> Any:
    """Returns `horovod.tensorflow`.

    Raises:
        ImportError: naming the install command, when Horovod (or its TensorFlow extension) cannot load.
    """
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise ImportError(f"kfast.distributed needs Horovod with TensorFlow support ({e}); {INSTALL_HINT}.") from e
    return hvd


def init() -> None:
    """Starts Horovod, pins this rank to the GPU of its local rank and makes Horovod's topology current.

    Outside `horovodrun`, without Horovod installed, it warns and makes the single-process topology current.

    Raises:
        ImportError: when launched by `horovodrun` but Horovod cannot be imported.
        RuntimeError: when TensorFlow already initialised the GPUs, or this host runs more processes than it
            has GPUs.
    """
    global _hvd
    try:
        hvd = import_horovod()
    except ImportError:
        if launched():
            raise
        warnings.warn(f"Horovod is not installed; running as a single process. To scale out, {INSTALL_HINT}.",
                      stacklevel=3)
        topology.set_current(topology.SINGLE_PROCESS)
        return
    hvd.init()
    _pin_gpu(hvd.local_rank(), hvd.local_size())
    _hvd = hvd
    topology.set_current(_HorovodTopology(hvd))


def collectives() -> HorovodCollectives:
    """Horovod's collectives, for the router (`kfast.distributed.collectives`) once `init()` started it."""
    return HorovodCollectives(_hvd)


def restart() -> None:
    """Shuts Horovod down and starts it again: how an elastic job re-forms its ring after ranks left or
    joined (rank and size may change). GPU pinning stays as `init()` left it."""
    if _hvd is not None:
        _hvd.shutdown()
        _hvd.init()


def elastic_api() -> tuple[Any, Any, Any, Any]:
    """Horovod's elastic-training pieces, for `kfast.distributed.elastic`.

    Returns:
        `(notification_manager, HorovodInternalError, HostsUpdatedInterrupt, HostUpdateResult)`.
    """
    from horovod.common.elastic import notification_manager
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    return notification_manager, HorovodInternalError, HostsUpdatedInterrupt, HostUpdateResult


def _pin_gpu(local_rank: int, local_size: int) -> None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if local_size > len(gpus):
        raise RuntimeError(
            f"This host runs {local_size} kfast processes but has {len(gpus)} GPU(s); launch at most "
            f"{len(gpus)} per host (e.g. horovodrun -H host:{len(gpus)})."
        )
    gpu = gpus[local_rank]
    try:
        tf.config.set_visible_devices(gpu, "GPU")
        # Memory growth lets a second framework (or NVML tooling) share the card with this rank.
        tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as e:
        raise RuntimeError(
            "TensorFlow already initialised the GPUs, so this rank cannot be pinned to one; call "
            "kfast.distributed.init() at the top of the script, before building models or tensors."
        ) from e
