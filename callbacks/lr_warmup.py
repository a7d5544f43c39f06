"""LearningRateWarmup: the linear scaling rule with gradual warm-up (Goyal et al., 2017)."""

import keras

from kfast import distributed


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramps the learning rate from `initial_lr` to `initial_lr * multiplier` over the first epochs.

    With N ranks the global batch is N times larger; "Accurate, Large Minibatch SGD" (Goyal et al.)
    scales the learning rate by N and reaches it gradually, per batch, so early training stays stable.
    After the warm-up the rate stays at the target (combine with a schedule of your own after that).

    Args:
        initial_lr: the single-process learning rate. Defaults to `None`: the optimizer's rate when
            training begins.
        warmup_epochs: epochs to reach the target. Defaults to `5`.
        multiplier: target / initial rate. Defaults to `None`: the number of ranks.
        steps_per_epoch: batches per epoch. Defaults to `None`: read from `fit`'s params.
        verbose: 1 prints the rate at each epoch end on rank 0. Defaults to `0`.

    Example:

    >>> model.fit(loader, epochs=90, callbacks=[kfast.callbacks.LearningRateWarmup(warmup_epochs=5)])  # doctest: +SKIP
    """

    def __init__(self, initial_lr=None, warmup_epochs=5, multiplier=None, steps_per_epoch=None, verbose=0):
        super().__init__()
        if not isinstance(warmup_epochs, (int, float)) or isinstance(warmup_epochs, bool) or warmup_epochs < 0:
            raise ValueError(f"LearningRateWarmup got warmup_epochs={warmup_epochs!r}; it must be a number >= 0.")
        if multiplier is not None and multiplier <= 0:
            raise ValueError(f"LearningRateWarmup got multiplier={multiplier!r}; it must be > 0 (usually the "
                             "number of ranks, the default).")
        self.initial_lr = initial_lr
        self.warmup_epochs = warmup_epochs
        self.multiplier = multiplier
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        self._multiplier = self.multiplier or distributed.size()
        self._steps = self.steps_per_epoch or self.params.get("steps")
        if not self._steps:
            raise ValueError("LearningRateWarmup needs the number of batches per epoch; pass steps_per_epoch=.")
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def rate_at(self, epoch, batch):
        """The learning rate for `batch` of `epoch` (both from 0)."""
        if self.warmup_epochs == 0:
            return self.initial_lr * self._multiplier
        progress = min(1.0, (epoch + (batch + 1) / self._steps) / self.warmup_epochs)
        return self.initial_lr * (1 + progress * (self._multiplier - 1))

    def on_train_batch_begin(self, batch, logs=None):
        # Per batch on purpose: a per-epoch jump of N x is what the gradual warm-up exists to avoid.
        if self._epoch < self.warmup_epochs:
            self.model.optimizer.learning_rate = self.rate_at(self._epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        if logs is not None:
            logs["learning_rate"] = lr
        if self.verbose and distributed.is_chief():
            print(f"\nEpoch {epoch + 1}: learning rate {lr:.6g}")
