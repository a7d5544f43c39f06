"""LearningRateWarmup: the linear scaling rule with gradual warm-up (Goyal et al., 2017)."""

from __future__ import annotations

from typing import Any

import keras
from kfast._core.checks import check_number
from kfast._core import topology
from kfast._core.messages import print_msg

from kfast.distributed import checkpoint

_STATE_KEY = "base_learning_rate"


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the learning rate from `initial_lr` to `initial_lr * multiplier` over the first epochs.

    With N ranks the global batch is N times larger; "Accurate, Large Minibatch SGD" (Goyal et al.)
    scales the learning rate by N and reaches it gradually, per batch, so early training stays stable.
    After the warm-up the rate stays at the target (combine with a schedule of your own after that).

    The base (single-rank) rate is part of the training state: `RankZeroCheckpoint` saves it with each
    checkpoint and `kfast.distributed.restore()` brings it back, so a resumed run follows exactly the
    rates of an uninterrupted one, and a run resumed on another number of ranks scales the same base by
    the new number (keeping its place in the warm-up).

    Args:
        initial_lr: the single-process learning rate. Defaults to `None`: the base restored from a
            checkpoint, else the optimizer's rate when training first begins.
        warmup_epochs: epochs to reach the target; 0 uses the target from the first batch. Defaults to `5`.
        multiplier: target / initial rate. Defaults to `None`: the number of ranks.
        steps_per_epoch: batches per epoch. Defaults to `None`: read from `fit`'s params.
        verbose: 1 prints the rate at each epoch end on rank 0. Defaults to `0`.

    Raises:
        ValueError: for bad arguments, or (when training begins) an optimizer whose learning rate is a
            `LearningRateSchedule`, which this callback cannot set.

    Example:

    >>> import keras, kfast.callbacks
    >>> warmup = kfast.callbacks.LearningRateWarmup(initial_lr=0.1, warmup_epochs=2, multiplier=4,
    ...                                             steps_per_epoch=10)
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile(keras.optimizers.SGD(0.1), "mse")
    >>> warmup.set_model(model)
    >>> warmup.on_train_begin()
    >>> round(warmup.rate_at(epoch=0, batch=9), 6), round(warmup.rate_at(epoch=3, batch=0), 6)
    (0.25, 0.4)
    """

    def __init__(self, initial_lr: float | None = None, warmup_epochs: float = 5, multiplier: float | None = None,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        super().__init__()
        check_number("LearningRateWarmup", "warmup_epochs", warmup_epochs, least=0, unit="epochs")
        check_number("LearningRateWarmup", "initial_lr", initial_lr, above=0,
                     or_none="for the optimizer's rate when training begins")
        check_number("LearningRateWarmup", "multiplier", multiplier, above=0, or_none="for the number of ranks")
        self.initial_lr = initial_lr
        self.warmup_epochs = warmup_epochs
        self.multiplier = multiplier
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = self.model.optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        if isinstance(getattr(inner, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"LearningRateWarmup got an optimizer whose learning rate is a "
                f"{type(inner._learning_rate).__name__} schedule, which it cannot set. Either scale the schedule "
                "yourself (e.g. its initial_learning_rate x kfast.distributed.size()) and leave this callback "
                "out, or give the optimizer a constant rate.")
        state = checkpoint.training_state(self.model)
        if self.initial_lr is not None:
            self._base = float(self.initial_lr)
        elif _STATE_KEY in state:
            # Resumed: the optimizer holds an already scaled rate; the checkpoint holds the base.
            self._base = float(state[_STATE_KEY])
        else:
            self._base = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        state[_STATE_KEY] = self._base
        self._multiplier = self.multiplier or topology.size()
        self._steps = self.steps_per_epoch or self.params.get("steps")
        if not self._steps:
            raise ValueError("LearningRateWarmup needs the number of batches per epoch; pass steps_per_epoch=.")
        self._epoch = 0

    def rate_at(self, epoch: int, batch: int) -> float:
        """The learning rate for `batch` of `epoch` (both from 0)."""
        if self.warmup_epochs == 0:
            return self._base * self._multiplier
        progress = min(1.0, (epoch + (batch + 1) / self._steps) / self.warmup_epochs)
        return self._base * (1 + progress * (self._multiplier - 1))

    def _in_warmup(self, epoch: int) -> bool:
        return epoch < self.warmup_epochs

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        if not self._in_warmup(epoch):
            # Once per epoch after the warm-up: also right after a resume, and from the start when warmup_epochs=0.
            self.model.optimizer.learning_rate = self.rate_at(epoch, 0)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Per batch on purpose: a per-epoch jump of N x is what the gradual warm-up exists to avoid.
        if self._in_warmup(self._epoch):
            # Inside an epoch resumed from a checkpoint, its batches trained before count too.
            offset = checkpoint.epoch_offset(self.model)
            self.model.optimizer.learning_rate = self.rate_at(self._epoch, offset + batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        if logs is not None:
            logs["learning_rate"] = lr
        if self.verbose and topology.is_chief():
            print_msg(f"\nEpoch {epoch + 1}: learning rate {lr:.6g}")
