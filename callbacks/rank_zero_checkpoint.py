"""RankZeroCheckpoint: checkpoints written once, by rank 0, atomically."""

import os

import keras
import numpy as np

from kfast import checkpoint
from kfast import distributed


class RankZeroCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (weights and optimizer state) after each epoch, on rank 0 only.

    Files go to `directory/epoch-NNNN.keras` (NNNN counts from 1, so `kfast.distributed.restore` returns
    it as `initial_epoch`), written to a temporary file and renamed, so a crash never leaves a broken
    checkpoint. The last `keep` epoch files are kept, and `best.keras` holds the best model by `monitor`.

    Args:
        directory: where to write. Created if missing.
        monitor: the log value that defines "best"; `None` disables `best.keras`. Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (max for accuracy-like names, else min). Defaults to `"auto"`.
        keep: how many epoch checkpoints to keep. Defaults to `3`.
        verbose: 1 prints a line per save. Defaults to `0`.

    Example:

    >>> model.fit(loader, epochs=10, callbacks=[kfast.callbacks.RankZeroCheckpoint("ckpt")])  # doctest: +SKIP
    """

    def __init__(self, directory, monitor="val_loss", mode="auto", keep=3, verbose=0):
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"RankZeroCheckpoint got mode={mode!r}; use 'auto', 'min' or 'max'.")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"RankZeroCheckpoint got keep={keep!r}; it must be a positive int.")
        self.directory, self.monitor, self.keep, self.verbose = directory, monitor, keep, verbose
        if mode == "auto":
            mode = "max" if monitor and ("acc" in monitor or monitor.endswith("auc")) else "min"
        self.mode = mode

    def on_train_begin(self, logs=None):
        self._best = None
        if distributed.is_chief():
            os.makedirs(self.directory, exist_ok=True)

    def _improved(self, value):
        if self._best is None:
            return True
        return value < self._best if self.mode == "min" else value > self._best

    def on_epoch_end(self, epoch, logs=None):
        if not distributed.is_chief():
            return
        path = checkpoint.epoch_path(self.directory, epoch + 1)
        checkpoint.save_atomic(self.model, path)
        for old in checkpoint.list_epochs(self.directory)[:-self.keep]:
            os.remove(checkpoint.epoch_path(self.directory, old))
        value = (logs or {}).get(self.monitor) if self.monitor else None
        if value is not None and np.isfinite(value) and self._improved(value):
            self._best = float(value)
            checkpoint.save_atomic(self.model, os.path.join(self.directory, "best.keras"))
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: saved {path}")
