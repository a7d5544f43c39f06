"""EpochClock: the base of callbacks that measure the training part of each epoch (`ThroughputMonitor`,
`AutoTune`), as Keras's `MonitorCallback` is the base of those that watch a metric.

An epoch's clock starts at `on_epoch_begin` and stops when validation begins (Keras validates before
`on_epoch_end`) or at `on_epoch_end` when there is none: only training steps count. With a `FastLoader`
it also reads the loader's counters at both ends: the seconds the training loop waited for batches, and
the samples served.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import keras

from kfast._core.step_shares import input_wait_share

# The clock, a module attribute so tests can script time without touching any signature.
_clock = time.perf_counter


@dataclasses.dataclass(frozen=True)
class EpochSpan:
    """The training part of one epoch: its `seconds`, the seconds spent `waiting` for input, and the
    `samples` served (both 0 without a loader)."""

    seconds: float
    waiting: float
    samples: int

    @property
    def input_wait_fraction(self) -> float:
        """The share of the epoch's training time spent waiting for input, in [0, 1]: the input wait part
        of kfast's one accounting of a step (NOTE [ One accounting of a step ] in `kfast._core.step_shares`)."""
        return input_wait_share(self.waiting, self.seconds)


class EpochClock(keras.callbacks.Callback):
    """Times the training part of each epoch; subclasses read it with `epoch_span()` in `on_epoch_end`.

    Subclasses that override a hook call this class's hook too.

    Args:
        loader: a `FastLoader` whose wait and sample counters to read, or `None`. Defaults to `None`.
    """

    def __init__(self, loader: Any = None) -> None:
        super().__init__()
        self.loader = loader
        self._start: tuple[float, float, int] | None = None
        self._span: EpochSpan | None = None

    def _read(self) -> tuple[float, float, int]:
        if self.loader is None:
            return _clock(), 0.0, 0
        return _clock(), self.loader.wait_seconds, getattr(self.loader, "samples_served", 0)

    def _stop(self) -> None:
        if self._start is not None and self._span is None:
            (t0, w0, s0), (t1, w1, s1) = self._start, self._read()
            self._span = EpochSpan(t1 - t0, w1 - w0, s1 - s0)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._start, self._span = None, None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start, self._span = self._read(), None

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Validation inside fit's epoch ends its training part; a standalone evaluate() has no epoch.
        self._stop()

    def epoch_span(self) -> EpochSpan | None:
        """The epoch's training span (stopping the clock now if validation did not), or `None` outside an
        epoch; the clock then waits for the next `on_epoch_begin`."""
        self._stop()
        span, self._start, self._span = self._span, None, None
        return span
