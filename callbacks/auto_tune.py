"""AutoTune: tune a FastLoader before training, and again when input waiting grows."""

import time

import keras
from kfast._core.checks import check_number
from kfast._core.messages import print_msg

from kfast.distributed import _horovod as distributed
from kfast.tuning.search import tune

# The clock, a module attribute so tests can script time without touching the signature.
_clock = time.perf_counter
# The tuning function, a module attribute so tests can script results without touching the signature.
_tune = tune


class AutoTune(keras.callbacks.Callback):
    """Applies `kfast.tune` to the loader feeding `fit`, at the start and whenever input becomes the limit.

    Before the first epoch it tunes the loader's dataset (or reads the cached result) and reconfigures
    the loader. At each epoch end it checks the share of the epoch spent waiting for batches; above
    `threshold` it measures again (ignoring the cache) and applies the new settings for the next epoch.
    Changes are logged on rank 0.

    Args:
        loader: the `kfast.data.FastLoader` passed to `fit`.
        threshold: input-wait fraction that triggers re-tuning. Defaults to `0.2`.
        budget_s: seconds each tuning may take. Defaults to `30`.
        verbose: 1 prints what changed (rank 0). Defaults to `1`.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> with kfast.data.FastLoader(data) as loader:
    ...     tuner = kfast.callbacks.AutoTune(loader, budget_s=1, verbose=0)
    ...     history = model.fit(loader, epochs=2, verbose=0, callbacks=[tuner])
    >>> tuner.changes[0]["reason"]
    'before training'
    """

    def __init__(self, loader, threshold=0.2, budget_s=30, verbose=1):
        super().__init__()
        if not hasattr(loader, "configure"):
            raise ValueError(f"AutoTune got {type(loader).__name__}; it tunes a kfast.data.FastLoader.")
        check_number("AutoTune", "threshold", threshold, above=0, below=1, hint="a fraction of the epoch")
        check_number("AutoTune", "budget_s", budget_s, above=0, unit="seconds", hint="e.g. budget_s=30")
        self.loader, self.threshold, self.budget_s, self.verbose = loader, threshold, budget_s, verbose
        self.changes = []

    def _apply(self, reason, force):
        before = self.loader.settings
        result = _tune(self.loader.dataset, budget_s=self.budget_s, force=force)
        self.loader.configure(**result.settings)
        after = self.loader.settings
        self.changes.append({"reason": reason, "before": before, "after": after})
        if self.verbose and distributed.is_chief():
            print_msg(f"\nkfast AutoTune ({reason}): {before} -> {after}, {result.batches_per_s:.1f} batches/s")

    def on_train_begin(self, logs=None):
        self.changes = []
        self._start = None
        self._apply("before training", force=False)

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._wait0, self._measured = _clock(), self.loader.wait_seconds, None

    def on_test_begin(self, logs=None):
        # Validation inside fit's epoch does not count: only training steps wait on this loader.
        if getattr(self, "_start", None) is not None and self._measured is None:
            self._measured = (self.loader.wait_seconds - self._wait0, _clock() - self._start)

    def on_epoch_end(self, epoch, logs=None):
        if self._measured is None:
            self._measured = (self.loader.wait_seconds - self._wait0, _clock() - self._start)
        wait, elapsed = self._measured
        self._start = None
        waited = wait / max(1e-9, elapsed)
        if waited > self.threshold:
            self._apply(f"epoch {epoch + 1} waited {waited:.0%} for input", force=True)
