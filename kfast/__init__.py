"""kfast: keep the accelerator fed and scale Keras 3 training with Horovod."""

__version__ = "0.1.0"

from kfast import callbacks  # noqa: E402 - the version above is read by setup.cfg without importing
from kfast import data  # noqa: E402
from kfast import distributed  # noqa: E402
from kfast import nvml  # noqa: E402
from kfast import recipes  # noqa: E402
from kfast.measure import diagnose  # noqa: E402
from kfast.optimizer import DistributedOptimizer  # noqa: E402
from kfast.tuner import TuneResult  # noqa: E402
from kfast.tuner import tune  # noqa: E402

__all__ = ["DistributedOptimizer", "TuneResult", "__version__", "callbacks", "data", "diagnose", "distributed",
           "nvml", "recipes", "tune"]
