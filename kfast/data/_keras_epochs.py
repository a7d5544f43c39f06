"""The part of a FastLoader that Keras's calls reach: one iteration per Keras epoch (with `fit`'s shuffle), the
dataset hooks around it, and what `evaluate` and `predict` read (see `kfast.data._keras_adapter`)."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any
from typing import cast

from kfast.data import position
from kfast.data._loader_args import RAN_OUT
from kfast.data._loader_order import TRAIN


class KerasEpochs:
    """FastLoader's Keras-facing methods; the loader owns every attribute they use."""

    _readings: list[str]
    _order: Any
    _lock: Any
    _cursor: Any
    _stream: Any
    _quiet: Any
    shuffle: bool | None

    def _iterate(self, shuffled: bool, reading: str = TRAIN) -> Any:
        raise NotImplementedError

    def _sharded_by_itself(self) -> bool:
        return self._order.sharded == position.OWN and self._order.size > 1

    def _sharded_by_hand(self) -> bool:
        return self._order.sharded == position.GIVEN and self._order.size > 1

    @property
    def _reading(self) -> str:
        return self._readings[-1] if self._readings else TRAIN

    @contextlib.contextmanager
    def _keras_reading(self, reading: str) -> Iterator[None]:
        """While Keras's `evaluate` or `predict` runs, its iterations read `reading` (see
        `kfast.data._keras_adapter`): the loader's length and epochs follow."""
        if not self._sharded_by_itself():
            yield  # one process, or a ShardedDataset's own layout: every call reads the same batches
            return
        self._readings.append(reading)
        try:
            yield
        finally:
            self._readings.pop()

    def _keras_epoch(self, shuffle: bool) -> Iterator[Any]:
        """One epoch for Keras's adapter (see `kfast.data._keras_adapter`): `shuffle` is `fit`'s."""
        it = self._iterate(self.shuffle if self.shuffle is not None else bool(shuffle), self._reading)
        with self._lock:
            self._cursor.keras.append(it)
            if it.plan.start and self._quiet is None:
                # Only that one message, and only until this epoch ends (on_epoch_end).
                warnings.filterwarnings("ignore", message=RAN_OUT)
                self._quiet = warnings.filters[0]
        yield from it

    def on_epoch_begin(self) -> None:
        # A Ctrl-C caught before this epoch is not ours to act on.
        self._stream.interrupt_mark = time.monotonic()
        self._stream.interrupted = False

    def on_epoch_end(self) -> None:
        with self._lock:
            ended = self._cursor.keras_ended()
            if ended is not None:
                if ended.done:
                    ended.finish()
            if self._quiet is not None and ended is not None and ended.plan.start:
                with contextlib.suppress(ValueError):
                    cast(list, warnings.filters).remove(self._quiet)
                self._quiet = None

