"""What the loader and its worker processes send each other through a worker's duplex pipe: small
dataclasses, matched by type (as PyTorch's DataLoader sends `_ResumeIteration` and `ExceptionWrapper`),
never positional tuples. Imported by workers: dataclasses only.

Loader to worker: `Task`, `NewDataset` (after an epoch hook changed the dataset), `NewRing` (write into
this segment from now on; `name` None: no ring) and `Stop`. Worker to loader: `Ready` once, when it has
unpickled the dataset (or `StartFailed`, and it exits), then per task one of `InSharedMemory`, `Pickled`
or `Failed`.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """Load batch `index` of `epoch` as task `seq`, into shared-memory slot `slot` (-1: no slot lent)."""

    seq: int
    index: int
    epoch: int
    slot: int


@dataclasses.dataclass(frozen=True, slots=True)
class NewDataset:
    """The dataset, pickled again after the loader ran an epoch hook on it."""

    payload: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class NewRing:
    """Write batches into this shared-memory segment from now on; `name` None: send them pickled."""

    name: str | None
    slot_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """Exit the loop."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """The worker unpickled the dataset and takes tasks now (a batch's timeout counts from here)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StartFailed:
    """The worker could not start (the dataset did not unpickle, say); `text` is its traceback."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class InSharedMemory:
    """Task `seq`'s arrays are in its slot, laid out as `layout` (dtype, shape, offset per leaf) under the
    nesting `spec`."""

    seq: int
    spec: Any
    layout: list[tuple[Any, tuple[int, ...], int]]
    skipped: tuple[str, ...] = ()  # bad records the dataset left out of it (its `take_skipped()`)


@dataclasses.dataclass(frozen=True, slots=True)
class Pickled:
    """Task `seq`'s batch itself, as its nesting `spec` and `leaves`: not plain numeric arrays (`wanted` 0),
    or no slot was free or big enough (`wanted`: the slot size it would need, in bytes)."""

    seq: int
    spec: Any
    leaves: list[Any]
    wanted: int
    skipped: tuple[str, ...] = ()  # as InSharedMemory's


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    """The dataset raised on task `seq` (batch `index`) in worker `worker` (process `pid`): `error` is the
    exception itself when it survives pickling (it is re-raised with its own type), `text` the worker's
    formatted traceback."""

    seq: int
    index: int
    text: str
    worker: int
    pid: int
    error: BaseException | None = None


Reply = InSharedMemory | Pickled | Failed
