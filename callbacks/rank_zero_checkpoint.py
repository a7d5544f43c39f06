"""RankZeroCheckpoint: Keras's ModelCheckpoint for data-parallel jobs: rank 0 writes, atomically, and a
resumed run keeps its directory's best model."""

from __future__ import annotations

import math
import os
import signal
import tempfile
import warnings
from typing import Any
from typing import cast

import keras
from kfast._core.checks import check_int, check_number
from kfast._core.messages import print_msg

from kfast.distributed import _checkpoint_files as files
from kfast.distributed import checkpoint
from kfast.distributed import collectives
from kfast.distributed import preemption
from kfast.distributed._checkpoint_files import Position
from kfast.distributed._checkpoint_paths import FileNames, checked_directory
from kfast.distributed._data_state import DataState
from kfast.distributed.optimizer import unwrap_for_saving


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
    """Saves the model after each epoch (or every N batches) on rank 0 only, keeping the newest and the best.

    Keras's `ModelCheckpoint` for a job of many ranks (one process works too). Files go to `directory`,
    named by `filename` (by default `epoch-NNNN.keras`, NNNN counting from 1, so that
    `kfast.distributed.restore` returns it as `initial_epoch`); each is written to a temporary file and
    renamed, so a crash never leaves a broken checkpoint. The newest `keep` are kept, and `best.keras`
    (`best.weights.h5` with `save_weights_only`) holds the best model by `monitor`, which is what Keras's
    `save_best_only=True` keeps. Each file also records how far training had gone and this callback's best
    value so far: `restore(model, directory)` resumes from the newest and gives that best back to the
    callback of the same directory, so a worse epoch does not replace `best.keras` after a restart; a
    callback writing another directory starts from `initial_value_threshold`. The directory is checked
    writable when training begins, before any epoch runs.

    Args:
        directory: where to write; created if missing. Keras's `filepath` is `directory` + `filename`.
        monitor: the log value that defines "best"; `None` disables the best file. Defaults to `"val_loss"`.
        mode: `"min"`, `"max"` or `"auto"` (the direction Keras gives the metric: loss down, accuracy,
            precision, recall, AUC and F1 up). Defaults to `"auto"`.
        keep: how many checkpoints to keep, besides the best file. Defaults to `3`.
        verbose: 1 prints a line per save, on rank 0. Defaults to `0`.
        initial_value_threshold: a value `monitor` must beat before the best file is first written, as in
            Keras's `ModelCheckpoint`. Defaults to `None`.
        filename: the files' name, a template as in Keras's `filepath`: `{epoch}` (from 1), `{batch}` (from
            1, with an int `save_freq`) and keys of the logs, with format specs, e.g.
            `"{epoch:02d}-{val_loss:.2f}.keras"`. It ends in `.keras`, or in `.weights.h5` with
            `save_weights_only`. Defaults to `None`: `epoch-{epoch:04d}.keras`, with `-batch-{batch:04d}`
            before the suffix for an int `save_freq`.
        save_weights_only: `True` writes `.weights.h5` files (`model.save_weights`: the weights and the
            optimizer's state, not the model's configuration). Defaults to `False`.
        save_freq: `"epoch"` saves after each epoch; an int N saves after every N training batches instead,
            as Keras's does (a save after an epoch's last batch counts as that epoch's end). A save inside
            an epoch records where the data stood, and `kfast.distributed.restore` resumes right there.
            Defaults to `"epoch"`.
        preemption_signals: signals that preempt: on one, every rank stops after the same step, rank 0
            writes a step checkpoint (`epoch-NNNN-batch-NNNN.keras`), and `kfast.distributed.Preempted`
            ends the run with exit status 75 ("resumable"). Name Slurm's `--signal` too, e.g.
            `("SIGTERM", "SIGUSR1")`; `None` leaves signals alone. Ctrl-C keeps interrupting at once.
            Defaults to `("SIGTERM",)`.
        preemption_timeout: seconds from the signal for the current step to finish; past them (a stuck
            batch, a dead peer) the process ends at once, without a step checkpoint, with status 128 + the
            signal, and says so. Keep it under the grace period. Defaults to `20`.
        loader: the `kfast.data.FastLoader` that `fit` trains on: each checkpoint records where it stood
            (`state_dict()`, every rank's), so that `kfast.distributed.restore(model, directory, loader=loader)`
            resumes inside an epoch exactly. Without it, a checkpoint saved inside an epoch resumes at that
            epoch's first batch. Defaults to `None`.

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
    _resolved: bool
    _warned_missing: bool
    _epoch: int
    _since_save: int
    _last_batch: int | None

    def __init__(self, directory: str | os.PathLike[str], monitor: str | None = "val_loss", mode: str = "auto",
                 keep: int = 3, verbose: int = 0, initial_value_threshold: float | None = None, *,
                 filename: str | None = None, save_weights_only: bool = False, save_freq: str | int = "epoch",
                 preemption_signals: tuple[str | int, ...] | None = ("SIGTERM",),
                 preemption_timeout: float = 20.0, loader: Any = None) -> None:
        super().__init__()
        self.directory = checked_directory("RankZeroCheckpoint", "directory", directory,
                                           "RankZeroCheckpoint('checkpoints')")
        if self.directory.endswith((".keras", ".h5")):
            head, tail = os.path.split(self.directory.rstrip(os.sep))
            raise ValueError(f"RankZeroCheckpoint got directory={self.directory!r}, a file name; it takes the "
                             "directory to write and names the files itself: pass "
                             f"RankZeroCheckpoint({head or '.'!r}, filename={tail!r}).")
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"RankZeroCheckpoint got mode={mode!r}; use 'auto', 'min' or 'max'.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ValueError(f"RankZeroCheckpoint got monitor={monitor!r}; it must be the name of a log value "
                             "(a str such as 'val_loss'), or None to write no best file.")
        check_int("RankZeroCheckpoint", "keep", keep, hint="the newest checkpoints kept, besides the best")
        check_int("RankZeroCheckpoint", "verbose", verbose, least=0, hint="0 is silent, 1 prints each save")
        check_number("RankZeroCheckpoint", "initial_value_threshold", initial_value_threshold,
                     or_none="to save the first epoch's model as the best")
        if not isinstance(save_weights_only, bool):
            raise ValueError(f"RankZeroCheckpoint got save_weights_only={save_weights_only!r}; it must be True "
                             "(.weights.h5 files) or False (whole .keras models).")
        if save_freq != "epoch":
            check_int("RankZeroCheckpoint", "save_freq", save_freq, hint="or 'epoch'; an int N saves every N "
                      "training batches")
        if loader is not None and not callable(getattr(loader, "state_dict", None)):
            raise ValueError(f"RankZeroCheckpoint got loader={type(loader).__name__}; pass the kfast.data.FastLoader "
                             "that fit trains on (its position goes into each checkpoint), or leave loader out.")
        self.loader = loader
        self._signums = preemption.signal_numbers("RankZeroCheckpoint", preemption_signals)
        check_number("RankZeroCheckpoint", "preemption_timeout", preemption_timeout, above=0, unit="seconds")
        self._names = FileNames(filename, save_weights_only, per_batch=save_freq != "epoch")
        self._step_names = FileNames(None, save_weights_only, per_batch=True)
        self.monitor, self.mode, self.keep, self.verbose = monitor, mode, keep, verbose
        self.initial_value_threshold = initial_value_threshold
        self.filename, self.save_weights_only, self.save_freq = self._names.template, save_weights_only, save_freq
        self.preemption_signals = tuple(signal.Signals(n).name for n in self._signums) or None
        self.preemption_timeout = preemption_timeout
        if save_freq != "epoch":
            # Only then: Keras dispatches batch hooks asynchronously unless a callback overrides one.
            self.on_train_batch_end = self._save_on_batch
        # The best so far of this callback's directory; kept from one fit to the next, as Keras's is.
        self._best: float | None = None
        self._best_ready = False
        self._pending: dict[str, Any] | None = None
        self._taken: checkpoint.RestorePoint | None = None
        self._watch: preemption.PreemptionWatch | None = None
        self._last_path = ""

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._warned_missing = False
        # On every rank: the user's own model.save then writes a file plain Keras opens, as these checkpoints are.
        unwrap_for_saving(self.model)
        problem = self._check_writable() if collectives.is_chief() else None
        # All ranks raise together: a rank left alone would wait in the first collective for ever.
        problem = collectives.broadcast_object(problem, root_rank=0)
        if problem:
            raise ValueError(problem)
        point = checkpoint.restore_point(self.model)
        if point is not None and point is not self._taken and point.directory == os.path.realpath(self.directory):
            # Resumed from this directory: its best so far, as its newest checkpoint recorded it.
            self._taken, self._pending, self._best_ready = point, point.best, False
        self._mode = self.mode if self.mode != "auto" or not self.monitor else None
        self._resolved = False
        self._epoch, self._since_save, self._last_batch = 0, 0, None
        self._data = DataState(self.model, point, self.loader)
        self._epoch_saved: str | None = None  # the checkpoint of the epoch just ended, until the next one ends
        self._batch_saved: tuple[int, int, str] | None = None  # (epoch, batch, path) of the last save_freq save
        self._resolve(required=False)
        if self._signums:
            self._watch = preemption.PreemptionWatch(
                self._signums, self.preemption_timeout, self._remove_own_partial,
                f"the checkpoints in {self.directory} are as they were before the signal.")
            self._watch.start()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._watch is not None:
            # A signal noted after the last step ends the process as it would have without this callback.
            self._watch.stop(redeliver=True)
            self._watch = None

    def _remove_own_partial(self) -> None:
        if collectives.is_chief():
            files.remove_partial(self.directory, pid=os.getpid())

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
        if not self._best_ready:
            saved = self._pending or {}
            value = saved.get("value") if (saved.get("monitor"), saved.get("mode")) == (self.monitor, self._mode) \
                else None
            self._best = self.initial_value_threshold
            if value is not None and self._improved(value):
                self._best = float(value)
            self._best_ready, self._pending = True, None
        self._resolved = True

    def _check_writable(self) -> str | None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".write-check-"):
                pass
            removed = files.remove_partial(self.directory)
            if removed and self.verbose:
                print_msg(f"RankZeroCheckpoint: removed {len(removed)} partial file(s) of a save that was "
                          f"killed halfway: {', '.join(removed)}")
        except OSError as e:
            return (f"RankZeroCheckpoint cannot write to {self.directory!r} ({e.strerror or e}); pass a directory "
                    "rank 0 can write (checked before training, so no epoch is lost).")
        return None

    def _improved(self, value: float) -> bool:
        if self._best is None:
            return True
        return value < self._best if self._mode == "min" else value > self._best

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if batch == 0:
            self._data.epoch_begins(self._epoch)
        if self._watch is not None:
            # A batch's start is the end of the step before, and this hook costs Keras no asynchrony.
            self._stop_if_preempted(batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_saved = None
        if self.save_freq == "epoch":
            self._save(epoch, None, logs or {})
            self._epoch_saved = self._last_path

    def _save_on_batch(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Counted as Keras does, so that steps_per_execution > 1 (batch numbers that jump) saves as often.
        new_epoch = self._last_batch is None or batch <= self._last_batch
        self._since_save += batch + 1 if new_epoch else batch - cast(int, self._last_batch)
        self._last_batch = batch
        self._batch_saved = None
        if self._since_save >= cast(int, self.save_freq):
            self._since_save = 0
            self._save(self._epoch, batch, logs or {})
            self._batch_saved = (self._epoch, batch, self._last_path)

    def _stop_if_preempted(self, batch: int) -> None:
        watch = cast(preemption.PreemptionWatch, self._watch)
        steps = self._steps()
        if steps and self._data.offset() + batch >= steps:
            return  # Keras's look past a resumed epoch's last batch: its end comes first
        name = watch.agree(self.model.optimizer)  # every rank, every step: all stop after the same step
        if name is None:
            return
        watch.reached_boundary()
        trained = self._data.offset() + batch
        if batch == 0 and self._epoch_saved:
            path = self._epoch_saved  # the epoch before ended, and its checkpoint is where training stands
        elif batch and self._batch_saved is not None and self._batch_saved[:2] == (self._epoch, batch - 1):
            path = self._batch_saved[2]  # save_freq saved this very step
        else:
            path = self._save(self._epoch, batch - 1 if batch else None, {}, step_file=True, at=trained)
        self._stop(preemption.Preempted(name, path, self._epoch, trained))

    def _stop(self, stopped: preemption.Preempted) -> None:
        if collectives.is_chief():
            print_msg(f"\nkfast: {stopped}.")
        self.model.stop_training = True
        if self._watch is not None:
            self._watch.stop(redeliver=False)
            self._watch = None
        preemption.leave(stopped)

    def _steps(self) -> int:
        return int((self.params or {}).get("steps") or 0)

    def _position(self, epoch: int, batch: int | None) -> Position:
        if batch is None:
            return Position(epoch + 1)
        trained = self._data.offset() + batch + 1
        steps = self._steps()
        if steps and trained >= steps:
            return Position(epoch + 1)  # all of the epoch's batches are trained
        return Position(epoch, trained)

    def _save(self, epoch: int, batch: int | None, logs: dict[str, Any], step_file: bool = False,
              at: int | None = None) -> str:
        """Saves after `batch` of `epoch` (None: at the epoch's end, or with `at`, a step checkpoint
        `at` batches into the epoch, before this fit trained any of it). Returns the path."""
        if not self._resolved:
            self._resolve(required=True)
        ahead = batch is None and at is not None  # a step checkpoint before this fit's first batch of the epoch
        position = Position(epoch, cast(int, at)) if ahead else self._position(epoch, batch)
        # Every rank: each one's data view and metric state (one collective; all ranks save at the same step).
        # Reading `self.model` has Keras's JAX trainer put the step's values back into the model's variables,
        # which it keeps apart while fit runs; without it a step checkpoint read emptied metric variables.
        self._data.model = self.model
        data = self._data.gather(-1 if ahead else batch, finished=position.batch == 0 and not ahead)
        # The file names count the epoch's batches, those trained before a resume included.
        shown = None if batch is None and not ahead else self._data.offset() + (-1 if batch is None else batch)
        names = self._step_names if step_file else self._names
        name = names.format(epoch, shown, logs)  # on every rank: a bad template stops all ranks together
        value = logs.get(self.monitor) if self.monitor else None
        if self.monitor and value is None and not self._warned_missing and not step_file:
            self._warned_missing = True
            if collectives.is_chief():
                kind = "epoch" if batch is None else "batch"
                warnings.warn(f"RankZeroCheckpoint monitors {self.monitor!r}, which is not in the {kind} logs (they "
                              f"hold {sorted(logs)}); {self._names.best} is not written. Pass validation data or "
                              "another monitor=.", stacklevel=3)
        previous = self._best
        improved = not step_file and value is not None and math.isfinite(value) and self._improved(value)
        if improved and value is not None:  # improved implies a value; this says so to the type checker
            self._best = float(value)
        path = self._last_path = os.path.join(self.directory, name)
        if not collectives.is_chief():
            return path
        best = {"monitor": self.monitor, "mode": self._mode, "value": self._best} if self.monitor else None
        checkpoint.save_atomic(self.model, path, position=position, best=best, data=data)
        files.prune(self.directory, self.keep, name)
        if improved:
            checkpoint.save_atomic(self.model, os.path.join(self.directory, self._names.best), position=position,
                                   best=best, data=data)
        if self.verbose:
            where = f"Epoch {epoch + 1}" + ("" if shown is None else f", batch {shown + 1}")
            if improved:
                note = (f"; {self.monitor} improved from {_shown(previous)} to {_shown(value)}, saved as "
                        f"{self._names.best} too")
            elif value is not None:
                note = f"; {self.monitor} did not improve from {_shown(self._best)}"
            else:
                note = ""
            print_msg(f"\n{where}: saved {path}{note}")
        return path


def _shown(value: float | None) -> str:
    return "None" if value is None else f"{value:.5f}"
