"""kfast's collectives and its place in the job, answered by the engine the job runs on.

NOTE [ The engine boundary ]
kfast runs on one of two engines: Horovod on Keras's TensorFlow backend (`_horovod`, the only module that
imports Horovod) and Keras's own distribution on its JAX backend (`_jax`). Each speaks only its own
framework. This module is the router between them and the rest of kfast: `init()` picks the engine from
Keras's backend and how the process was started, and each collective goes to the engine in use, or to
the identity of one process (`_SingleProcess`) while the job has one. Every kfast caller imports this
module, never an engine, and the public names (`kfast.distributed.init`, `rank`, `broadcast_object`, ...)
are this module's.

Rank, size and whether `init()` ran are the topology's (`kfast._core.topology`), which the engine sets:
this module reads them there, so there is one answer (`is_initialized` is the topology's own function).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Sequence
from typing import Any
from typing import Protocol

from kfast._core import topology
from kfast.distributed import _horovod
from kfast.distributed import _jax
from kfast.distributed._horovod import horovodrun_path  # noqa: F401 - public as kfast.distributed.horovodrun_path

is_initialized = topology.is_initialized  # the one answer: see NOTE [ Who owns the topology ]


class Collectives(Protocol):
    """What each engine's collectives answer (`_horovod.HorovodCollectives`, `_jax.JaxCollectives`), every
    rank calling each in the same order."""

    def allreduce_average(self, tensors: Sequence[Any], name: str | None) -> list[Any]: ...

    def broadcast_variables(self, variables: Iterable[Any], root_rank: int) -> None: ...

    def broadcast_object(self, obj: Any, root_rank: int) -> Any: ...

    def allgather_object(self, obj: Any) -> list[Any]: ...

    def allreduce_mean_values(self, values: Sequence[float]) -> list[float]: ...

    def allreduce_sum_values(self, values: Sequence[float]) -> list[float]: ...

    def allreduce_max_ints(self, values: Sequence[int]) -> list[int]: ...


class _SingleProcess:
    """One process (no engine, or a job of one rank): every collective the identity, as Lightning's
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

    def allreduce_max_ints(self, values: Sequence[int]) -> list[int]:
        return [int(v) for v in values]


_ALONE = _SingleProcess()


def _collectives() -> Collectives:
    """The collectives for the job as it is now: an elastic job may shrink to one rank or grow from it, so
    this is asked each time, not cached."""
    _require_init()
    if topology.size() == 1:
        return _ALONE
    return _jax.collectives() if _jax.started() else _horovod.collectives()


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
    if topology.is_initialized():
        return
    backend = _keras_backend()
    if backend == "jax" and not _horovod.launched():
        _jax.init()
        return
    if backend != "tensorflow":
        if _horovod.launched():
            raise RuntimeError(_backend_problem(backend) + ".")
        warnings.warn(_backend_problem(backend) + "; running as a single process.", stacklevel=2)
        topology.set_current(topology.SINGLE_PROCESS)
        return
    _horovod.init()


def _require_init() -> None:
    if not topology.is_initialized() and (_horovod.launched() or _jax.launched()):
        launcher = "horovodrun" if _horovod.launched() else "kfast launch (or srun) as one of several processes"
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


def verbose(level: int | str = "auto") -> int | str:
    """Returns `level` on rank 0 and 0 elsewhere: `model.fit(..., verbose=kfast.distributed.verbose())`."""
    return level if is_chief() else 0


def _checked_root(caller: str, root_rank: int) -> int:
    # A root no rank holds would leave every rank waiting (or reading zeros): say so instead.
    n = topology.size()
    if n > 1 and not 0 <= root_rank < n:
        raise ValueError(f"{caller} got root_rank={root_rank}; this job's ranks are 0 to {n - 1}.")
    return root_rank


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

    Raises:
        ValueError: for a `root_rank` that is not a rank of the job.
    """
    collectives = _collectives()
    collectives.broadcast_variables(variables, _checked_root("broadcast_variables", root_rank))


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """Returns root_rank's `obj` on every rank (any picklable object); each rank receives one copy.

    Raises:
        ValueError: for a `root_rank` that is not a rank of the job.
    """
    collectives = _collectives()
    return collectives.broadcast_object(obj, _checked_root("broadcast_object", root_rank))


def allgather_object(obj: Any) -> list[Any]:
    """Returns the list of every rank's `obj`, indexed by rank (any picklable object)."""
    return _collectives().allgather_object(obj)


def allreduce_mean_values(values: Sequence[float]) -> list[float]:
    """Returns the element-wise mean over ranks of a list of Python floats (float64, exact order)."""
    return _collectives().allreduce_mean_values(values)


def allreduce_sum_values(values: Sequence[float]) -> list[float]:
    """Returns the element-wise sum over ranks of a list of Python floats (float64, exact order)."""
    return _collectives().allreduce_sum_values(values)


def allreduce_max_ints(values: Sequence[int]) -> list[int]:
    """Returns the element-wise maximum over ranks of a short list of ints (each within +-2**31), in one
    small collective: a vote every rank takes at every step (`kfast.distributed.preemption`)."""
    return _collectives().allreduce_max_ints(values)


def saving_alone() -> contextlib.AbstractContextManager[None]:
    """Lets rank 0 save the model while the others go on (on the JAX engine a new variable is otherwise placed
    by a collective every process must join; elsewhere there is nothing to do)."""
    return _jax.saving_alone()


def load_on_every_process(model: Any, path: str) -> None:
    """Loads rank 0's checkpoint `path` into `model` on every process: how the JAX engine restores, where a
    weight's assignment is a collective (NOTE [ Every JAX process loads the file ] in `checkpoint`)."""
    _jax.load_on_every_process(model, path)
