"""Tuning: FastLoader's workers, processes or threads and queue depth, picked by measurement.

`search` measures and chooses (`tune`, `TuneResult`); `cache` keeps results per host and dataset.
`tf_data` tunes a `tf.data.Dataset` instead (`TfDataSettings`, `TfDataTuneResult`).
"""

from kfast.tuning.search import TuneResult
from kfast.tuning.search import tune
from kfast.tuning.tf_data_result import TfDataTuneResult
from kfast.tuning.tf_data_settings import TfDataSettings

__all__ = ["TfDataSettings", "TfDataTuneResult", "TuneResult", "tune"]
