"""MetricAverage: epoch logs and `evaluate` hold the whole job's numbers, not one rank's."""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from kfast._core import keras_reads
from kfast._core import topology
from kfast.distributed import collectives
from kfast.distributed.metric_state import sum_metric_states


def _numeric(logs: dict[str, Any]) -> list[str]:
    return sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))


class MetricAverage(keras.callbacks.Callback):
    """Makes the numbers in `logs` the whole job's: training values averaged over ranks, evaluation
    metrics as one process evaluating every rank's samples would compute them.

    Put it before callbacks that read `logs` (checkpoints, early stopping, CSV and TensorBoard loggers)
    so they all see the global numbers. Every rank issues the same collectives, in sorted-name order.

    Evaluation: a FastLoader that is not training data is read whole on every rank, so its results are one
    process's already and nothing is summed. Over data each rank reads a part of (a tf.data pipeline sharded
    with `kfast.data.shard(data, rank, size, mode="all")`: every batch once over the ranks), the metrics'
    states (a Mean's total and count, AUC's counts) are summed over ranks before Keras computes the results:
    `val_` values in `fit`, and what `evaluate(..., callbacks=[MetricAverage()])` returns, are exact and the
    same on every rank, whatever the shards' sizes. A metric class of your own must keep state that adds up
    over samples (a total and a count do; a running maximum does not). Standalone `evaluate` needs data whose
    length Keras knows (the sum happens after the last batch); otherwise it warns and returns this rank's own.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> logger = keras.callbacks.CSVLogger("log.csv")
    >>> _ = model.fit(data, epochs=1, verbose=0, callbacks=[kfast.callbacks.MetricAverage(), logger])
    >>> with open("log.csv") as f:
    ...     f.readline().strip()
    'epoch,loss,val_loss'
    """

    def __init__(self) -> None:
        super().__init__()
        self._in_fit = False
        self._last_step: int | None = None
        self._validation: dict[str, float] = {}
        self._reads_before = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._in_fit, self._validation = True, {}

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._in_fit = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._validation = {}

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # A standalone evaluate's params count its own steps; fit's validation is settled in on_test_end.
        self._reads_before = keras_reads.whole_reads()
        steps = None if self._in_fit else self.params.get("steps")
        self._last_step = steps - 1 if steps else None
        if not self._in_fit and steps is None and collectives.size() > 1:
            warnings.warn("MetricAverage cannot tell when this evaluate ends (the data has no length Keras knows), so "
                          f"it returns rank {collectives.rank()}'s own metrics; give the data a length (a PyDataset, or "
                          "tf.data with a known cardinality) or pass steps=.", stacklevel=2)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras reads the metrics' results right after the last batch: their states are summed just before.
        if batch == self._last_step and self._per_rank():
            sum_metric_states(self.model)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._in_fit and collectives.size() > 1:
            if self._per_rank():
                sum_metric_states(self.model)
            results = self.model.get_metrics_result()
            self._validation = {f"val_{k}": float(keras.ops.convert_to_numpy(v)) for k, v in results.items()
                                if np.ndim(keras.ops.convert_to_numpy(v)) == 0}

    def _per_rank(self) -> bool:
        """Whether this evaluation read per-rank parts: no FastLoader read whole on every rank since it began (a
        sum over data every rank read whole would count each sample once per rank). Every rank read the same
        kinds of data, so every rank decides alike and the collectives match."""
        return keras_reads.whole_reads() == self._reads_before

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or collectives.size() == 1 or topology.one_step_for_all():
            return  # on the JAX engine the step ran over the whole job's batch (kfast/distributed/_jax.py)
        # Validation values come from the summed states (on_test_end); the rest is averaged over ranks.
        names = [k for k in _numeric(logs) if k not in self._validation]
        if names:
            logs.update(zip(names, collectives.allreduce_mean_values([float(logs[k]) for k in names])))
        logs.update({k: v for k, v in self._validation.items() if k in logs})
