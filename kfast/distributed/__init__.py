"""Data-parallel training with Horovod on Keras 3: topology, collectives, resuming and standard callbacks.

`kfast.distributed.collectives` starts the job's engine and routes the collectives to it (NOTE [ The engine
boundary ]): Horovod on TensorFlow (`_horovod`, the only module that imports Horovod) or Keras's distribution
on JAX (`_jax`); `optimizer` averages gradients across ranks (`DistributedOptimizer`); `checkpoint` saves and
restores training state; `preemption` stops every rank at the same step on a signal; `defaults` assembles the
standard callbacks; `elastic` and `elastic_loop` keep a job training while ranks leave and join.

The names load on first use (PEP 562), as `kfast` and `kfast.data` do: Python runs this file before any
module of the package, and `kfast.callbacks` and `kfast.data` use the collectives of `collectives` while
`default_callbacks` and `elastic_fit` use them in turn, so importing all of them here would make each such
import a cycle.
"""

import importlib
from typing import TYPE_CHECKING
from typing import Any

__all__ = ["RESUMABLE_EXIT", "DistributedOptimizer", "Preempted", "UnequalStepsError", "allgather_object", "allreduce_average", "allreduce_mean_values",
           "allreduce_sum_values", "broadcast_object", "broadcast_variables", "callbacks", "default_callbacks",
           "elastic_fit", "horovodrun_path", "init", "is_chief", "is_initialized", "load_model", "local_rank",
           "local_size", "predict", "rank", "restore", "size", "verbose"]

_ROUTER = "kfast.distributed.collectives"  # NOTE [ The engine boundary ]
_HOMES = {"predict": "kfast.distributed.prediction", "RESUMABLE_EXIT": "kfast.distributed.preemption", "DistributedOptimizer": "kfast.distributed.optimizer",
          "Preempted": "kfast.distributed.preemption", "UnequalStepsError": "kfast.distributed.steps",
          "callbacks": "kfast.distributed.defaults", "default_callbacks": "kfast.distributed.defaults",
          "elastic_fit": "kfast.distributed.elastic_loop", "restore": "kfast.distributed.checkpoint",
          "load_model": "kfast.distributed.checkpoint",
          **dict.fromkeys(("allgather_object", "allreduce_average", "allreduce_mean_values", "allreduce_sum_values",
                           "broadcast_object", "broadcast_variables", "horovodrun_path", "init", "is_chief",
                           "is_initialized", "local_rank", "local_size", "rank", "size", "verbose"), _ROUTER)}
# Submodules a user may reach as attributes (`kfast.distributed.checkpoint.restore_point`), which an eager
# __init__ used to import.
_SUBMODULES = ("checkpoint", "defaults", "elastic", "elastic_loop", "metric_state", "optimizer", "prediction", "preemption", "steps")

if TYPE_CHECKING:  # what IDEs and type checkers read
    from kfast.distributed import checkpoint, defaults, elastic, elastic_loop, metric_state  # noqa: F401
    from kfast.distributed import optimizer, preemption, steps  # noqa: F401
    from kfast.distributed.collectives import allgather_object  # noqa: F401
    from kfast.distributed.collectives import allreduce_average  # noqa: F401
    from kfast.distributed.collectives import allreduce_mean_values  # noqa: F401
    from kfast.distributed.collectives import allreduce_sum_values  # noqa: F401
    from kfast.distributed.collectives import broadcast_object  # noqa: F401
    from kfast.distributed.collectives import broadcast_variables  # noqa: F401
    from kfast.distributed.collectives import horovodrun_path  # noqa: F401
    from kfast.distributed.collectives import init  # noqa: F401
    from kfast.distributed.collectives import is_chief  # noqa: F401
    from kfast.distributed.collectives import is_initialized  # noqa: F401
    from kfast.distributed.collectives import local_rank  # noqa: F401
    from kfast.distributed.collectives import local_size  # noqa: F401
    from kfast.distributed.collectives import rank  # noqa: F401
    from kfast.distributed.collectives import size  # noqa: F401
    from kfast.distributed.collectives import verbose  # noqa: F401
    from kfast.distributed.checkpoint import load_model  # noqa: F401
    from kfast.distributed.checkpoint import restore  # noqa: F401
    from kfast.distributed.defaults import callbacks  # noqa: F401
    from kfast.distributed.defaults import default_callbacks  # noqa: F401
    from kfast.distributed.elastic_loop import elastic_fit  # noqa: F401
    from kfast.distributed.optimizer import DistributedOptimizer  # noqa: F401
    from kfast.distributed.prediction import predict  # noqa: F401
    from kfast.distributed.preemption import RESUMABLE_EXIT  # noqa: F401
    from kfast.distributed.preemption import Preempted  # noqa: F401
    from kfast.distributed.steps import UnequalStepsError  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"kfast.distributed.{name}")  # the import sets it on this package
    if name not in _HOMES:
        raise AttributeError(f"module 'kfast.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
