"""AutoTune: tune a FastLoader before training, and again when input waiting grows."""

from __future__ import annotations

from typing import Any

from kfast._core import topology
from kfast._core.checks import check_number
from kfast._core.epoch_clock import EpochClock
from kfast._core.messages import print_msg
from kfast.tuning.search import tune

# The tuning function, a module attribute so tests can script results without touching the signature.
_tune = tune


class AutoTune(EpochClock):
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

    def __init__(self, loader: Any, threshold: float = 0.2, budget_s: float = 30, verbose: int = 1) -> None:
        super().__init__(loader)
        if not hasattr(loader, "configure"):
            raise ValueError(f"AutoTune got {type(loader).__name__}; it tunes a kfast.data.FastLoader.")
        check_number("AutoTune", "threshold", threshold, above=0, below=1, hint="a fraction of the epoch")
        check_number("AutoTune", "budget_s", budget_s, above=0, unit="seconds", hint="e.g. budget_s=30")
        self.threshold, self.budget_s, self.verbose = threshold, budget_s, verbose
        self.changes: list[dict[str, Any]] = []

    def _apply(self, reason: str, force: bool) -> None:
        before = self.loader.settings
        result = _tune(self.loader.dataset, budget_s=self.budget_s, force=force)
        self.loader.configure(**result.settings)
        after = self.loader.settings
        self.changes.append({"reason": reason, "before": before, "after": after})
        if self.verbose and topology.is_chief():
            print_msg(f"\nkfast AutoTune ({reason}): {before} -> {after}, {result.batches_per_s:.1f} batches/s")

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        self.changes = []
        self._apply("before training", force=False)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        span = self.epoch_span()
        if span is not None and span.input_wait_fraction > self.threshold:
            self._apply(f"epoch {epoch + 1} waited {span.input_wait_fraction:.0%} for input", force=True)
