"""kfast: keep the accelerator fed and scale Keras 3 training with Horovod.

The public names load on first use (PEP 562 `__getattr__`), so `import kfast` stays light: loader worker
processes, the command line and `kfast doctor` import Keras and TensorFlow only when they need them.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["DistributedOptimizer", "Plan", "TuneResult", "__version__", "callbacks", "data", "diagnose",
           "distributed", "nvml", "plan", "recipes", "tune"]

_HOMES = {"DistributedOptimizer": "kfast.optimizer", "TuneResult": "kfast.tuner", "diagnose": "kfast.measure",
          "tune": "kfast.tuner", "plan": "kfast.planner", "Plan": "kfast.planner", "callbacks": None, "data": None, "distributed": None, "nvml": None,
          "recipes": None}

if TYPE_CHECKING:  # what IDEs and type checkers read
    from kfast import callbacks, data, distributed, nvml, recipes  # noqa: F401
    from kfast.measure import diagnose  # noqa: F401
    from kfast.optimizer import DistributedOptimizer  # noqa: F401
    from kfast.planner import Plan, plan  # noqa: F401
    from kfast.tuner import TuneResult, tune  # noqa: F401


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError(f"module 'kfast' has no attribute {name!r}")
    home = _HOMES[name]
    value = importlib.import_module(f"kfast.{name}") if home is None else getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
