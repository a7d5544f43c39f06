"""The process topology: this process's rank, the job's size and its place on its host.

NOTE [ Who owns the topology ]

This module owns one piece of state, the *current topology*: an object that answers `rank()`, `size()`,
`local_rank()` and `local_size()`. Until `kfast.distributed.init()` runs there is none, and readers see the
single-process topology (rank 0 of 1, alone on its host), so everything runs unchanged as one process. The
engine that `init()` starts makes its own topology current with `set_current` (Horovod's, or the JAX
processes'), or the single-process one when it finds one process; nothing else writes it. So whether
`init()` ran is one fact, kept here: `is_initialized()` (the public `kfast.distributed.is_initialized`).
Everyone else only reads the topology, through the functions below, so `kfast.data`, `kfast.diagnosis` and
`kfast.distributed` see one answer without importing an engine.

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
# See NOTE [ Who owns the topology ]: written by set_current only; None until kfast.distributed.init() ran.
_current: Topology | None = None


def set_current(topology: Topology | None) -> None:
    """Makes `topology` the one every reader sees, and marks the job started; for the engine that starts it.

    `kfast.distributed.init()` calls it once its engine runs (with `SINGLE_PROCESS` when it found one
    process). Training code reads the topology and never sets it.

    Args:
        topology: the engine's topology; `None` goes back to the start: one process, `init()` not run.

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
    _current = topology


def current() -> Topology:
    """Returns the current topology: the engine's once one started, else `SINGLE_PROCESS`.

    Example:

    >>> current()
    SingleProcess()
    """
    return SINGLE_PROCESS if _current is None else _current


def is_initialized() -> bool:
    """Returns True once `kfast.distributed.init()` ran in this process (an engine set the topology), also
    when it found a single process: `kfast.distributed.is_initialized` is this function.

    Example:

    >>> is_initialized()
    False
    >>> set_current(SINGLE_PROCESS)  # what init() does when it finds one process
    >>> is_initialized(), size()
    (True, 1)
    >>> set_current(None)
    """
    return _current is not None


def one_step_for_all() -> bool:
    """Returns True when one compiled step runs over every process's part of the batch (Keras's distribution
    on JAX): gradients and metric states are then the whole job's already, with nothing to exchange.

    An engine's topology says so with a true `one_step_for_all` attribute; Horovod's ranks each run their own
    step, so the answer is False there and for a single process.

    Example:
    >>> one_step_for_all()
    False
    """
    return bool(getattr(current(), "one_step_for_all", False))


def rank() -> int:
    """Returns this process's global rank (0 for a single process).

    Example:

    >>> rank()
    0
    """
    return int(current().rank())


def size() -> int:
    """Returns the number of processes in the job (1 for a single process).

    Example:

    >>> size()
    1
    """
    return int(current().size())


def local_rank() -> int:
    """Returns this process's rank on its host (0 for a single process), e.g. to pick its GPU.

    Example:

    >>> local_rank()
    0
    """
    return int(current().local_rank())


def local_size() -> int:
    """Returns the number of the job's processes on this host (1 for a single process).

    Example:

    >>> local_size()
    1
    """
    return int(current().local_size())


def is_chief() -> bool:
    """Returns True on rank 0, the process that prints, logs and writes files.

    Example:

    >>> is_chief()
    True
    """
    return rank() == 0
