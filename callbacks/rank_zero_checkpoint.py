"""RankZeroCheckpoint: checkpoints written once, by rank 0, atomically, with a best model that survives resumes."""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from typing import Any
from typing import cast

import keras
from kfast._core.checks import check_int, check_number
from kfast._core.messages import print_msg

from kfast.distributed import checkpoint
from kfast.distributed import _horovod as distributed

_STATE_KEY = "best"


def metric_direction(model: keras.Model, monitor: str) -> str | None:
    """Returns "min" or "max" for `monitor` as Keras resolves it: loss is minimised, a compiled metric goes
    the way it declares (accuracy, precision, recall, AUC, F1 up; errors down), or None when unknown."""
    name = monitor.removeprefix("val_")
    if name == "loss" or name.endswith("_loss"):
        return "min"
    for metric in getattr(model, "metrics", None) or []:
        for m in getattr(metric, "metrics", None) or [metric]:
            if m.name == name and getattr(m, "_direction", None) in ("up", "down"):
                return "max" if m._direction == "up" else "min"
    return None


class RankZeroCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (weights, optimizer and training state) after each epoch, on rank 0 only.

    Files go to `directory/epoch-NNNN.keras` (NNNN counts from 1, so `kfast.distributed.restore` returns
    it as `initial_epoch`), written to a temporary file and renamed, so a crash never leaves a broken
    checkpoint. The last `keep` epoch files are kept, and `best.keras` holds the best model by `monitor`.
    The best value so far is saved inside each checkpoint, so after `restore()` a worse epoch does not
    replace `best.keras`. The directory is checked writable when training begins, before any epoch runs.

    Args:
        directory: where to write. Created if missing.
        monitor: the log value that defines "best"; `None` disables `best.keras`. Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (the direction Keras gives the metric: loss down, accuracy,
            precision, recall, AUC and F1 up). Defaults to `"auto"`.
        keep: how many epoch checkpoints to keep. Defaults to `3`.
        verbose: 1 prints a line per save. Defaults to `0`.
        initial_value_threshold: a value `monitor` must beat before `best.keras` is first written, as in
            Keras's `ModelCheckpoint`. Defaults to `None`.

    Raises:
        ValueError: for bad arguments; when training begins, for a directory that cannot be written, or
            `mode="auto"` on a metric whose direction Keras does not know.

    Example:

    >>> import os, tempfile, keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> directory = tempfile.mkdtemp()
    >>> saver = kfast.callbacks.RankZeroCheckpoint(directory, monitor="loss")
    >>> _ = model.fit(np.ones((8, 1)), np.ones(8), epochs=2, verbose=0, callbacks=[saver])
    >>> sorted(os.listdir(directory))
    ['best.keras', 'epoch-0001.keras', 'epoch-0002.keras']
    """

    # Per-run state, set in on_train_begin.
    _mode: str | None
    _best: float | None
    _resolved: bool
    _warned_missing: bool

    def __init__(self, directory: str | os.PathLike[str], monitor: str | None = "val_loss", mode: str = "auto",
                 keep: int = 3, verbose: int = 0, initial_value_threshold: float | None = None) -> None:
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"RankZeroCheckpoint got mode={mode!r}; use 'auto', 'min' or 'max'.")
        check_int("RankZeroCheckpoint", "keep", keep, hint="the newest epochs kept, besides the best")
        check_number("RankZeroCheckpoint", "initial_value_threshold", initial_value_threshold,
                     or_none="to save the first epoch's model as the best")
        self.directory, self.monitor, self.mode, self.keep, self.verbose = directory, monitor, mode, keep, verbose
        self.initial_value_threshold = initial_value_threshold

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._warned_missing = False
        problem = self._check_writable() if distributed.is_chief() else None
        # All ranks raise together: a rank left alone would wait in the first collective for ever.
        problem = distributed.broadcast_object(problem, root_rank=0)
        if problem:
            raise ValueError(problem)
        self._mode = self.mode if self.mode != "auto" or not self.monitor else None
        self._best, self._resolved = None, False
        self._resolve(required=False)

    def _resolve(self, required: bool) -> None:
        """Settles the direction (compiled metrics may be built only by the first step) and the best so far."""
        if self._mode is None:
            # on_train_begin leaves the direction open only for mode="auto" with a monitor.
            self._mode = metric_direction(self.model, cast(str, self.monitor))
            if self._mode is None:
                if not required:
                    return
                raise ValueError(
                    f"RankZeroCheckpoint got monitor={self.monitor!r} with mode='auto', but Keras does not say "
                    "whether that value should go up or down; pass mode='max' or mode='min'.")
        saved = checkpoint.training_state(self.model).get(_STATE_KEY)
        if saved and saved.get("monitor") == self.monitor and saved.get("mode") == self._mode:
            self._best = saved["value"]  # resumed: the best of the epochs before the restart
        else:
            self._best = self.initial_value_threshold
        self._save_best_state()
        self._resolved = True

    def _check_writable(self) -> str | None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".write-check-"):
                pass
            removed = checkpoint.remove_partial(self.directory)
            if removed and self.verbose:
                print_msg(f"RankZeroCheckpoint: removed {len(removed)} partial file(s) of a save that was "
                          f"killed halfway: {', '.join(removed)}")
        except OSError as e:
            return (f"RankZeroCheckpoint cannot write to {self.directory!r} ({e.strerror or e}); pass a directory "
                    "rank 0 can write (checked before training, so no epoch is lost).")
        return None

    def _save_best_state(self) -> None:
        value = None if self._best is None else float(self._best)
        checkpoint.training_state(self.model)[_STATE_KEY] = {"monitor": self.monitor, "mode": self._mode,
                                                             "value": value}

    def _improved(self, value: float) -> bool:
        if self._best is None:
            return True
        return value < self._best if self._mode == "min" else value > self._best

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not getattr(self, "_resolved", False):
            self._resolve(required=True)
        value = (logs or {}).get(self.monitor) if self.monitor else None
        if self.monitor and value is None and not self._warned_missing:
            self._warned_missing = True
            if distributed.is_chief():
                warnings.warn(f"RankZeroCheckpoint monitors {self.monitor!r}, which is not in the epoch logs "
                              f"(they hold {sorted(logs or {})}); best.keras is not written. Pass validation "
                              "data or another monitor=.", stacklevel=2)
        best_now = value is not None and math.isfinite(value) and self._improved(value)
        if best_now and value is not None:  # best_now implies a value; this says so to the type checker
            self._best = float(value)
            self._save_best_state()
        if not distributed.is_chief():
            return
        path = checkpoint.epoch_path(self.directory, epoch + 1)
        checkpoint.save_atomic(self.model, path)
        for old in checkpoint.list_epochs(self.directory)[:-self.keep]:
            os.remove(checkpoint.epoch_path(self.directory, old))
        if best_now:
            checkpoint.save_atomic(self.model, os.path.join(self.directory, "best.keras"))
        if self.verbose:
            print_msg(f"\nEpoch {epoch + 1}: saved {path}" + (f" and best.keras ({self.monitor}={value:.6g})"
                                                             if best_now else ""))
