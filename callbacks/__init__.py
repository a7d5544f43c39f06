"""Keras callbacks from kfast (installed as `kfast.callbacks`)."""

from kfast.callbacks.broadcast_state import BroadcastState
from kfast.callbacks.lr_warmup import LearningRateWarmup
from kfast.callbacks.metric_average import MetricAverage
from kfast.callbacks.rank_zero_checkpoint import RankZeroCheckpoint

__all__ = ["BroadcastState", "LearningRateWarmup", "MetricAverage", "RankZeroCheckpoint"]
