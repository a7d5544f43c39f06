"""Tuning: FastLoader's workers, processes or threads and queue depth, picked by measurement.

`search` measures and chooses (`tune`, `TuneResult`); `cache` keeps results per host and dataset.
"""

from kfast.tuning.search import TuneResult
from kfast.tuning.search import tune

__all__ = ["TuneResult", "tune"]
