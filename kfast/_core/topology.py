"""The process topology: this process's rank, the job's size and its place on its host.

NOTE [ Who owns the topology ]

This module owns one piece of state, the *current topology*: an object that answers `rank()`, `size()`,
`local_rank()` and `local_size()`. It starts as the single-process topology (rank 0 of 1, alone on its
host), so everything runs unchanged as one process. The engine that starts a multi-process job makes its
own topology current with `set_current`: today `kfast.distributed.init()` does, for Horovod; a JAX engine
will do the same. Nothing else writes it. Everyone else only reads it, through the functions below, so
`kfast.data`, `kfast.diagnosis` and `kfast.distributed` see one answer without importing an engine.

An engine's topology answers live rather than as a snapshot: an elastic job changes rank and size when its
ranks re-form, so readers ask each time instead of caching.

This module imports nothing of kfast, so any module may import it (it is on the ground floor).
"""

from __future__ import annotations

from typing import Protocol
from typing import runtime_checkable


@runtime_checkable
class Topology(Protocol):
    """Where this process stands in its job: what an engine hands to `set_current`.

    Each method answers as the job is now (a job may grow or shrink), as the engine's own `rank()` does.

    Example:

    >>> class TwoRanks:
    ...     def rank(self): return 1
    ...     def size(self): return 2
    ...     def local_rank(self): return 1
    ...     def local_size(self): return 2
    >>> isinstance(TwoRanks(), Topology)
    True
    """

    def rank(self) -> int:
        """Returns this process's global rank, from 0 to `size() - 1`."""
        ...

    def size(self) -> int:
        """Returns the number of processes in the job."""
        ...

    def local_rank(self) -> int:
        """Returns this process's rank among those on its host."""
        ...

    def local_size(self) -> int:
        """Returns the number of the job's processes on this host."""
        ...


class SingleProcess:
    """The null topology: one process, rank 0 of 1, alone on its host.

    It is current until an engine sets its own, so callers never branch on "is this distributed" (as
    Lightning's `SingleDeviceCollective` spares its callers).

    Example:

    >>> alone = SingleProcess()
    >>> alone.rank(), alone.size(), alone.local_rank(), alone.local_size()
    (0, 1, 0, 1)
    """

    def rank(self) -> int:
        """Returns 0."""
        return 0

    def size(self) -> int:
        """Returns 1."""
        return 1

    def local_rank(self) -> int:
        """Returns 0."""
        return 0

    def local_size(self) -> int:
        """Returns 1."""
        return 1

    def __repr__(self) -> str:
        return "SingleProcess()"


SINGLE_PROCESS = SingleProcess()
_current: Topology = SINGLE_PROCESS  # see NOTE [ Who owns the topology ]: written by set_current only


def set_current(topology: Topology | None) -> None:
    """Makes `topology` the one every reader sees; for the engine that starts the job.

    `kfast.distributed.init()` calls it once Horovod runs. Training code reads the topology and never
    sets it.

    Args:
        topology: the engine's topology; `None` goes back to the single-process one.

    Raises:
        TypeError: when `topology` lacks `rank`, `size`, `local_rank` or `local_size`.

    Example:

    >>> class SecondOfFour(SingleProcess):
    ...     def rank(self): return 1
    ...     def size(self): return 4
    >>> set_current(SecondOfFour())
    >>> rank(), size(), is_chief(), is_initialized()
    (1, 4, False, True)
    >>> set_current(None)
    >>> rank(), size(), is_initialized()
    (0, 1, False)
    """
    global _current
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"set_current got {topology!r}; it needs an object with rank(), size(), local_rank() and "
                        "local_size() methods (a kfast._core.topology.Topology), or None for a single process.")
    _current = SINGLE_PROCESS if topology is None else topology


def current() -> Topology:
    """Returns the current topology: the engine's once one started, else `SINGLE_PROCESS`.

    Example:

    >>> current()
    SingleProcess()
    """
    return _current


def is_initialized() -> bool:
    """Returns True while an engine's topology is current (False for a single process).

    Example:

    >>> is_initialized()
    False
    """
    return _current is not SINGLE_PROCESS


def one_step_for_all() -> bool:
    """Returns True when one compiled step runs over every process's part of the batch (Keras's distribution
    on JAX): gradients and metric states are then the whole job's already, with nothing to exchange.

    An engine's topology says so with a true `one_step_for_all` attribute; Horovod's ranks each run their own
    step, so the answer is False there and for a single process.

    Example:
    >>> one_step_for_all()
    False
    """
    return bool(getattr(_current, "one_step_for_all", False))


def rank() -> int:
    """Returns this process's global rank (0 for a single process).

    Example:

    >>> rank()
    0
    """
    return int(_current.rank())


def size() -> int:
    """Returns the number of processes in the job (1 for a single process).

    Example:

    >>> size()
    1
    """
    return int(_current.size())


def local_rank() -> int:
    """Returns this process's rank on its host (0 for a single process), e.g. to pick its GPU.

    Example:

    >>> local_rank()
    0
    """
    return int(_current.local_rank())


def local_size() -> int:
    """Returns the number of the job's processes on this host (1 for a single process).

    Example:

    >>> local_size()
    1
    """
    return int(_current.local_size())


def is_chief() -> bool:
    """Returns True on rank 0, the process that prints, logs and writes files.

    Example:

    >>> is_chief()
    True
    """
    return rank() == 0
