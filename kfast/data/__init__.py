"""Input pipelines: FastLoader, in-memory datasets and sharding across ranks.

The names load on first use (PEP 562), so that a loader worker process, which imports
`kfast.data._workers.worker`, loads numpy and nothing heavier.
"""

import importlib
from typing import TYPE_CHECKING
from typing import Any

__all__ = ["ArrayDataset", "FastLoader", "LoaderSettings", "PackedDataset", "ShardedDataset", "WorkerError", "pack",
           "shard"]

_HOMES = {"ArrayDataset": "kfast.data.arrays", "FastLoader": "kfast.data.loader", "LoaderSettings": "kfast.data.settings",
          "PackedDataset": "kfast.data.packed.dataset", "ShardedDataset": "kfast.data.sharding",
          "pack": "kfast.data.packed.writer",
          "WorkerError": "kfast.data._workers.pool", "shard": "kfast.data.sharding"}

if TYPE_CHECKING:  # what IDEs and type checkers read
    from kfast.data._workers.pool import WorkerError  # noqa: F401
    from kfast.data.arrays import ArrayDataset  # noqa: F401
    from kfast.data.loader import FastLoader  # noqa: F401
    from kfast.data.packed.dataset import PackedDataset  # noqa: F401
    from kfast.data.packed.writer import pack  # noqa: F401
    from kfast.data.settings import LoaderSettings  # noqa: F401
    from kfast.data.sharding import ShardedDataset, shard  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kfast.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
