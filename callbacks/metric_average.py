"""MetricAverage: epoch logs hold the mean over all ranks, not rank 0's own numbers."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kfast.distributed import _horovod as distributed


class MetricAverage(keras.callbacks.Callback):
    """Replaces each numeric value in the epoch's `logs` (train and validation) by its mean over ranks.

    Put it before callbacks that read `logs` (checkpoints, early stopping, CSV and TensorBoard loggers)
    so they all see the global numbers. Values are exchanged in sorted-name order, so every rank issues
    the same collectives.

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

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or distributed.size() == 1:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        if not names:
            return
        averaged = distributed.allreduce_mean_values([float(logs[k]) for k in names])
        logs.update(zip(names, averaged))
