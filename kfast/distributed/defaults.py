"""default_callbacks: kfast's standard distributed callbacks, in the order they must run."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    import keras


def default_callbacks(checkpoint_dir: str | os.PathLike[str] | None = None, *, warmup_epochs: int = 5,
                      monitor: str = "val_loss", keep: int = 3, verbose: int = 0, save_freq: str | int = "epoch",
                      preemption_signals: tuple[str | int, ...] | None = ("SIGTERM",), loader: Any = None
                      ) -> list[keras.callbacks.Callback]:
    """Returns kfast's standard distributed callbacks, in the order they must run.

    BroadcastState (same start on every rank), LearningRateWarmup (linear scaling rule), MetricAverage
    (global metrics in `logs`), and RankZeroCheckpoint when `checkpoint_dir` is given (after the
    averaging, so "best" means best globally).

    Args:
        checkpoint_dir: where rank 0 writes checkpoints; `None` writes none. Defaults to `None`.
        warmup_epochs: epochs of learning-rate warm-up; 0 uses the scaled rate from the first batch.
            Defaults to `5`.
        monitor: the value that picks `best.keras`. Defaults to `"val_loss"`.
        keep: epoch checkpoints kept. Defaults to `3`.
        verbose: 1 prints learning rates and saves on rank 0. Defaults to `0`.
        save_freq: `"epoch"`, or an int N to checkpoint every N batches as well (see `RankZeroCheckpoint`).
            Defaults to `"epoch"`.
        preemption_signals: the signals that stop every rank at the same step, write a step checkpoint and
            exit with status 75 (see `RankZeroCheckpoint`); `None` leaves them alone. Defaults to
            `("SIGTERM",)`.
        loader: the `kfast.data.FastLoader` that `fit` trains on, whose position each checkpoint records (pass
            it to `kfast.distributed.restore` too, to resume inside an epoch). Defaults to `None`.

    Returns:
        A list of Keras callbacks for `model.fit(..., callbacks=...)`.

    Example:

    >>> import kfast
    >>> [type(c).__name__ for c in kfast.distributed.default_callbacks("ckpt")]
    ['BroadcastState', 'LearningRateWarmup', 'MetricAverage', 'RankZeroCheckpoint']
    """
    from kfast.callbacks import BroadcastState, LearningRateWarmup, MetricAverage, RankZeroCheckpoint
    from kfast._core.callback_order import ordered

    out: list[keras.callbacks.Callback] = [
        BroadcastState(), LearningRateWarmup(warmup_epochs=warmup_epochs, verbose=verbose), MetricAverage()]
    if checkpoint_dir:
        out.append(RankZeroCheckpoint(checkpoint_dir, monitor=monitor, keep=keep, verbose=verbose, save_freq=save_freq,
                                      preemption_signals=preemption_signals, loader=loader))
    return ordered(out)  # monitors (if any) ahead of the callbacks that read their values


def callbacks(checkpoint_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> list[keras.callbacks.Callback]:
    """Deprecated name of `default_callbacks` (it read like the `kfast.callbacks` package); kept one release."""
    warnings.warn("kfast.distributed.callbacks() is now kfast.distributed.default_callbacks() (the old name read like the "
                  "kfast.callbacks package); the old name goes in the next release.", DeprecationWarning, stacklevel=2)
    return default_callbacks(checkpoint_dir, **kwargs)
