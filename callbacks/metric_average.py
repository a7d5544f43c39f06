"""MetricAverage: epoch logs hold the mean over all ranks, not rank 0's own numbers."""

import keras
import numpy as np

from kfast import distributed


class MetricAverage(keras.callbacks.Callback):
    """Replaces each numeric value in the epoch's `logs` (train and validation) by its mean over ranks.

    Put it before callbacks that read `logs` (checkpoints, early stopping, CSV and TensorBoard loggers)
    so they all see the global numbers. Values are exchanged in sorted-name order, so every rank issues
    the same collectives.

    Example:

    >>> model.fit(loader, callbacks=[kfast.callbacks.MetricAverage(), keras.callbacks.CSVLogger("log.csv")])  # doctest: +SKIP
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or distributed.size() == 1:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        if not names:
            return
        averaged = distributed.allreduce_mean_values([float(logs[k]) for k in names])
        logs.update(zip(names, averaged))
