"""kfast: keep the accelerator fed and scale Keras 3 training with Horovod."""

from kfast import data
from kfast import distributed
from kfast.measure import diagnose
from kfast import nvml
from kfast.optimizer import DistributedOptimizer
from kfast.tuner import TuneResult
from kfast.tuner import tune

__version__ = "0.1.0"

__all__ = ["DistributedOptimizer", "TuneResult", "data", "diagnose", "distributed", "nvml", "tune", "__version__"]
