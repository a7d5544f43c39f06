"""TfDataTuneResult: what `kfast.tune` chose for a `tf.data` pipeline, how fast it was, and every trial."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from kfast.tuning.tf_data_settings import TfDataSettings

if TYPE_CHECKING:
    import tensorflow as tf


class TfDataTuneResult:
    """The `tf.data` settings `kfast.tune` chose, as `TuneResult` is for a FastLoader.

    `result.loader(dataset)` (or its other name, `result.apply(dataset)`) returns the tuned pipeline, so
    `kfast.tune(ds, model=model).loader(ds)` reads the same for a `tf.data.Dataset` and for a PyDataset;
    `result.dataset` is the one built on the dataset that was tuned.

    Attributes:
        settings: the chosen `TfDataSettings`; `TfDataSettings()` ("as given") when nothing beat the
            pipeline as it was given.
        batches_per_s: the chosen pipeline's rate, the better of its two bursts in the final check beside
            the pipeline as given (training steps/s through `fit` when `tune` had a model).
        given_batches_per_s: the pipeline as given, measured the same way at the same time.
        trials: one dict per measurement: the six settings, `batches_per_s`, and `trial` ("given" for the
            first measurement of the pipeline as given, "tried", or "check" for the final four).
        cache_note: whether `cache()` was tried, and why not when it was not.
        measured: `"pipeline"` (batches read from the pipeline alone) or `"fit"` (training steps).
        dataset: the tuned pipeline over the dataset `tune` measured.

    Example:

    >>> import tensorflow as tf, kfast
    >>> ds = tf.data.Dataset.range(40).batch(8)
    >>> result = kfast.tune(ds, budget_s=1)
    >>> result.cache_note.split(":")[0], result.speedup >= 1.0  # the same batches every pass: cache() was tried
    ('tried', True)
    >>> [int(batch[0]) for batch in result.apply(ds)]
    [0, 8, 16, 24, 32]
    """

    def __init__(self, settings: TfDataSettings, batches_per_s: float, given_batches_per_s: float,
                 trials: list[dict[str, Any]], cache_note: str, measured: str, dataset: tf.data.Dataset) -> None:
        self.settings, self.batches_per_s, self.given_batches_per_s = settings, batches_per_s, given_batches_per_s
        self.trials, self.cache_note, self.measured, self.dataset = trials, cache_note, measured, dataset

    @property
    def speedup(self) -> float:
        """`batches_per_s / given_batches_per_s`: 1.0 when the pipeline as given was kept."""
        return self.batches_per_s / self.given_batches_per_s

    def loader(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Returns `dataset` with the chosen settings: a `tf.data.Dataset` to pass to `model.fit`."""
        return self.settings.apply(dataset)

    def apply(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """The same as `loader(dataset)`, named for what it does to a `tf.data` pipeline."""
        return self.settings.apply(dataset)

    def to_dict(self) -> dict[str, Any]:
        return {**self.settings.to_dict(), "batches_per_s": self.batches_per_s,
                "given_batches_per_s": self.given_batches_per_s, "cache_note": self.cache_note,
                "measured": self.measured, "trials": self.trials}

    def __str__(self) -> str:
        unit = "steps/s" if self.measured == "fit" else "batches/s"
        lines = [f"{'trial':<6} {'settings':<60} {unit:>10}"]
        for t in self.trials:
            settings = TfDataSettings.from_dict(t)
            chosen = " <- chosen" if settings == self.settings else ""
            lines.append(f"{t['trial']:<6} {str(settings):<60} {t['batches_per_s']:>10.1f}{chosen}")
        lines.append(f"chosen: {self.settings}, {self.batches_per_s:.1f} {unit} ({self.speedup:.2f}x the pipeline as "
                     f"given, {self.given_batches_per_s:.1f})")
        return "\n".join(lines + [f"cache(): {self.cache_note}"])
