"""Keras callbacks from kfast (installed as `kfast.callbacks`)."""

from kfast._core.callback_order import ordered
from kfast.callbacks.auto_tune import AutoTune
from kfast.callbacks.broadcast_state import BroadcastState
from kfast.callbacks.gpu_monitor import GPUMonitor
from kfast.callbacks.lr_warmup import LearningRateWarmup
from kfast.callbacks.metric_average import MetricAverage
from kfast.callbacks.rank_zero_checkpoint import RankZeroCheckpoint
from kfast.callbacks.throughput_monitor import ThroughputMonitor

__all__ = ["AutoTune", "BroadcastState", "GPUMonitor", "LearningRateWarmup", "MetricAverage", "RankZeroCheckpoint",
           "ThroughputMonitor", "ordered"]
