"""kfast: keep the accelerator fed and scale Keras 3 training with Horovod.

The public names load on first use (PEP 562 `__getattr__`), so `import kfast` stays light: loader worker
processes, the command line and `kfast doctor` import Keras and TensorFlow only when they need them.
"""

import importlib
from typing import TYPE_CHECKING
from typing import Any

from kfast._version import __version__

__all__ = ["Diagnosis", "DistributedOptimizer", "Plan", "TuneResult", "__version__", "callbacks", "data", "diagnose",
           "distributed", "nvml", "plan", "recipes", "tune"]

_HOMES = {"Diagnosis": "kfast.diagnosis", "DistributedOptimizer": "kfast.distributed", "Plan": "kfast.planning",
          "TuneResult": "kfast.tuning", "diagnose": "kfast.diagnosis", "plan": "kfast.planning", "tune": "kfast.tuning",
          "callbacks": None, "data": None, "distributed": None, "nvml": None, "recipes": None}

if TYPE_CHECKING:  # what IDEs and type checkers read
    from kfast import callbacks, data, distributed, nvml, recipes  # noqa: F401
    from kfast.diagnosis import Diagnosis, diagnose  # noqa: F401
    from kfast.distributed import DistributedOptimizer  # noqa: F401
    from kfast.planning import Plan, plan  # noqa: F401
    from kfast.tuning import TuneResult, tune  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kfast' has no attribute {name!r}")
    home = _HOMES[name]
    value = importlib.import_module(f"kfast.{name}") if home is None else getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
