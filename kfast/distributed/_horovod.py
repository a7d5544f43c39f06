"""Horovod for kfast: its start-up and collectives, and the engine each process runs on.

It imports only `kfast._core.topology` and, on Keras's JAX backend, the JAX engine (`_jax`) of kfast:
`init()` and the collectives below hand over to it there, so every caller keeps one set of lines.

This is the only kfast module that imports Horovod. `init()` starts it and makes Horovod's topology the
current one in `kfast._core.topology`, which owns rank and size: code that only needs those reads them
there, and code that needs a collective calls this module's. So the rest of kfast runs unchanged as a
single process when Horovod is absent or the script was not started by `horovodrun`.

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
from kfast.distributed import _jax

_INSTALL_HINT = (
    "install Horovod built for your TensorFlow with `bash scripts/install_horovod.sh` "
    "(or `make test`, which runs it), see README"
)
_hvd: Any = None  # horovod.tensorflow, once init() ran with Horovod present
_initialised = False


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


class _SingleProcess:
    """One process (no Horovod, or a job of one rank): every collective the identity, as Lightning's
    `SingleDeviceCollective`, so callers never branch on "is this distributed"."""

    def allreduce_average(self, tensors: Sequence[Any], name: str | None) -> list[Any]:
        return list(tensors)

    def broadcast_variables(self, variables: Iterable[Any], root_rank: int) -> None:
        return None

    def broadcast_object(self, obj: Any, root_rank: int) -> Any:
        return obj

    def allgather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def allreduce_mean_values(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def allreduce_sum_values(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]


class _Ring(_SingleProcess):
    """Two or more ranks: Horovod's TensorFlow collectives."""

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
        import tensorflow as tf

        mean = self.hvd.allreduce(tf.constant(values, dtype=tf.float64), op=self.hvd.Average, name="kfast.values")
        return [float(v) for v in mean.numpy()]

    def allreduce_sum_values(self, values: Sequence[float]) -> list[float]:
        import tensorflow as tf

        total = self.hvd.allreduce(tf.constant(values, dtype=tf.float64), op=self.hvd.Sum, name="kfast.sums")
        return [float(v) for v in total.numpy()]


_ALONE = _SingleProcess()


def _collectives() -> Any:
    """The collectives for the job as it is now: an elastic job may shrink to one rank or grow from it, so
    this is asked each time, not cached."""
    _require_init()
    if _jax.started() and topology.size() > 1:
        return _jax.JaxCollectives()
    if _hvd is None or _hvd.size() == 1:
        return _ALONE
    return _Ring(_hvd)


def _launched_by_horovodrun() -> bool:
    return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def horovodrun_path() -> str:
    """The `horovodrun` on PATH, else the one beside this Python (a virtualenv's bin/ that is not on PATH)."""
    return shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")


def import_horovod() -> Any:
    """Returns `horovod.tensorflow`.

    Raises:
        ImportError: naming the install command, when Horovod (or its TensorFlow extension) cannot load.
    """
    return _import_horovod()


def _import_horovod() -> Any:
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise ImportError(f"kfast.distributed needs Horovod with TensorFlow support ({e}); {_INSTALL_HINT}.") from e
    return hvd


def _keras_backend() -> str:
    import keras

    return str(keras.backend.backend())


def _backend_problem(backend: str) -> str:
    return (f"kfast.distributed scales out with Horovod on Keras's TensorFlow backend or with Keras's own "
            f"distribution on its JAX backend, but this process runs Keras on {backend}. Set KERAS_BACKEND=tensorflow "
            "(with Horovod installed, see README) or KERAS_BACKEND=jax to scale out")


def init() -> None:
    """Starts the job's engine: Horovod on TensorFlow (each process pinned to the GPU of its local rank), or
    Keras's distribution on JAX (the processes joined, data parallel over every device).

    Call it at the top of the training script, before building the model: pinning only works before
    TensorFlow touches the GPUs. Calling it again is harmless. Without `horovodrun` (or without Horovod
    installed, or with Keras on PyTorch, outside `horovodrun`) the process runs as rank 0 of 1, with a
    warning that says why. On JAX, a process not started by `kfast launch` (or `srun`) is rank 0 of 1,
    still data-parallel over its own devices when it has several.

    Raises:
        ImportError: when launched by `horovodrun` but Horovod cannot be imported.
        RuntimeError: when launched by `horovodrun` with Keras on a backend other than TensorFlow, when
            TensorFlow already initialised the GPUs, when this host runs more processes than it has GPUs, or
            when JAX processes cannot join.

    Example:

    It sets up Horovod for the rest of the process, so the doctests do not run this line:

    >>> import kfast
    >>> kfast.distributed.init()  # doctest: +SKIP
    >>> kfast.distributed.rank(), kfast.distributed.size()
    (0, 1)
    """
    global _hvd, _initialised
    if _initialised:
        return
    backend = _keras_backend()
    if backend == "jax" and not _launched_by_horovodrun():
        _jax.init()
        _initialised = True
        return
    if backend != "tensorflow":
        if _launched_by_horovodrun():
            raise RuntimeError(_backend_problem(backend) + ".")
        warnings.warn(_backend_problem(backend) + "; running as a single process.", stacklevel=2)
        _initialised = True
        return
    try:
        hvd = _import_horovod()
    except ImportError:
        if _launched_by_horovodrun():
            raise
        warnings.warn(f"Horovod is not installed; running as a single process. To scale out, {_INSTALL_HINT}.")
        _initialised = True
        return
    hvd.init()
    _pin_gpu(hvd.local_rank(), hvd.local_size())
    _hvd = hvd
    topology.set_current(_HorovodTopology(hvd))
    _initialised = True


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


def _require_init() -> None:
    if not _initialised and (_launched_by_horovodrun() or _jax.launched()):
        launcher = "horovodrun" if _launched_by_horovodrun() else "kfast launch (or srun) as one of several processes"
        raise RuntimeError(
            f"This process was started by {launcher} but kfast.distributed.init() was not called; call it "
            "at the top of the training script."
        )


def rank() -> int:
    """Returns this process's global rank (0 when not distributed)."""
    _require_init()
    return topology.rank()


def size() -> int:
    """Returns the number of processes in the job (1 when not distributed)."""
    _require_init()
    return topology.size()


def local_rank() -> int:
    """Returns this process's rank on its host (0 when not distributed)."""
    _require_init()
    return topology.local_rank()


def local_size() -> int:
    """Returns the number of processes on this host (1 when not distributed)."""
    _require_init()
    return topology.local_size()


def is_chief() -> bool:
    """Returns True on rank 0, the process that prints, logs and writes checkpoints."""
    return rank() == 0


def allreduce_average(tensors: Sequence[Any], name: str | None = None) -> list[Any]:
    """Averages a list of tensors across ranks in one fused collective.

    Every rank must call it with tensors of the same shapes, in the same order. Without Horovod it
    returns the tensors unchanged.

    Args:
        tensors: list of tensors (or `None` entries, passed through).
        name: optional name prefix that identifies this collective across ranks.

    Returns:
        A list of averaged tensors, in the input's order.
    """
    return _collectives().allreduce_average(tensors, name)


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Overwrites `variables` on every rank with root_rank's values.

    Works on Keras 3 variables (Horovod's own helper needs raw `tf.Variable`s and fails on them).

    Args:
        variables: iterable of Keras or TensorFlow variables, the same list on every rank.
        root_rank: the rank whose values win. Defaults to `0`.
    """
    _collectives().broadcast_variables(variables, root_rank)


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Returns root_rank's `obj` on every rank (any picklable object)."""
    return _collectives().broadcast_object(obj, root_rank)


def allgather_object(obj: Any) -> list[Any]:
    """Returns the list of every rank's `obj`, indexed by rank (any picklable object)."""
    return _collectives().allgather_object(obj)


def is_initialized() -> bool:
    """Returns True once `init()` ran in this process."""
    return _initialised


def allreduce_mean_values(values: Sequence[float]) -> list[float]:
    """Returns the element-wise mean over ranks of a list of Python floats (float64, exact order)."""
    return _collectives().allreduce_mean_values(values)


def allreduce_sum_values(values: Sequence[float]) -> list[float]:
    """Returns the element-wise sum over ranks of a list of Python floats (float64, exact order)."""
    return _collectives().allreduce_sum_values(values)


def verbose(level: int | str = "auto") -> int | str:
    """Returns `level` on rank 0 and 0 elsewhere: `model.fit(..., verbose=kfast.distributed.verbose())`."""
    return level if is_chief() else 0
