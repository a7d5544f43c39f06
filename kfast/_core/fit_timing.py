"""Timed training through `model.fit`'s own step, leaving the model as it was.

`kfast.diagnose` times the model alone and end to end, `kfast.tune(model=...)` scores each loader setting
by the steps/s training reaches with it, and `kfast.plan` times the compute of one step; all of them hand
the model back untouched, and all of them refuse a model they cannot train and put back in one way.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np


class StepClock(keras.callbacks.Callback):
    """Stamps the end of every training step and stops training after `most` steps, or once `seconds` have
    passed since the `warmup`-th step (and at least 3 steps were timed).

    Args:
        most: the most steps to train, warm-up included.
        warmup: steps before the timing starts (the first one traces the step). Defaults to `0`.
        seconds: stop after this long, counted from the end of warm-up. Defaults to `None`: after `most`.
    """

    def __init__(self, most: int, *, warmup: int = 0, seconds: float | None = None) -> None:
        super().__init__()
        self.most, self.warmup, self.seconds = most, warmup, seconds
        self.stamps: list[float] = []
        self.stopped = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.stamps, self.stopped = [time.perf_counter()], False

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        self.stamps.append(now)
        steps = len(self.stamps) - 1
        timed = steps - self.warmup
        if steps >= self.most or (self.seconds is not None and timed >= 3
                                  and now - self.stamps[self.warmup] >= self.seconds):
            self.stopped = True
            self.model.stop_training = True

    def step_seconds(self) -> np.ndarray:
        """Seconds of each step after warm-up."""
        return np.diff(self.stamps)[self.warmup:]

    def rate(self) -> float:
        """Steps per second after warm-up.

        Raises:
            RuntimeError: when training ended before the clock stopped it (too few steps to time).
        """
        timed = len(self.stamps) - 1 - self.warmup
        if not self.stopped or timed < 1:
            raise RuntimeError(f"the timed training ended after {len(self.stamps) - 1} steps, before it was timed.")
        return timed / (self.stamps[-1] - self.stamps[self.warmup])


def batches_per_epoch(data: Any) -> int | None:
    """Batches per epoch, or `None` when the data does not say (an iterable, a tf.data.Dataset of unknown
    cardinality)."""
    try:
        return len(data)
    except TypeError:
        return None


def timed_fit(model: keras.Model, data: Any, clock: StepClock) -> StepClock:
    """Trains `model` on `data` until `clock` stops it; data shorter than that is read for several epochs,
    as training would. `model.history` is left as it was."""
    length = batches_per_epoch(data)
    history = getattr(model, "history", None)
    try:
        if length is None:
            model.fit(data, epochs=1, steps_per_epoch=clock.most, verbose=0, callbacks=[clock])
        else:
            # Whole epochs rather than steps_per_epoch > length, which Keras ends early with "ran out of data".
            model.fit(data, epochs=math.ceil((clock.most + 1) / length), verbose=0, callbacks=[clock])
    finally:
        model.history = history  # fit replaced it with this run's
    return clock


def steps_per_s(model: keras.Model, data: Any, *, warmup: int = 2, seconds: float = 1.0) -> float:
    """Training steps/s of compiled `model` fed by `data` (a PyDataset such as a FastLoader), timed after
    `warmup` steps (the first traces the step) for about `seconds`, at most 20 passes over `data`."""
    most = warmup + 20 * len(data)
    return timed_fit(model, data, StepClock(most, warmup=warmup, seconds=seconds)).rate()


def check_model(caller: str, model: Any, *, built: bool = True) -> None:
    """Raises ValueError unless `model` can be trained and put back: compiled, and built unless `built=False`
    (for a caller that checks that later, with a message of its own).

    Example:

    >>> check_model("diagnose", keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    Traceback (most recent call last):
    ...
    ValueError: diagnose got model='sequential...', which is not compiled; call model.compile(optimizer, loss) first.
    """
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        name = getattr(model, "name", type(model).__name__)
        raise ValueError(f"{caller} got model={name!r}, which is not compiled; call model.compile(optimizer, loss) "
                         "first.")
    if built and not model.built:
        raise ValueError(f"{caller} got model {model.name!r}, which is not built yet, so its weights cannot be saved "
                         "and put back; build it first (keras.Input in the model, model.build(input_shape), or "
                         "call it on one batch).")


def _variables(model: keras.Model) -> list[Any]:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        # Slots made during the block (Adam's moments, ...) would keep what the block trained into them.
        optimizer.build(model.trainable_variables)
    return list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])


@contextlib.contextmanager
def state_kept(model: keras.Model) -> Iterator[None]:
    """Puts back the model's weights and optimizer state (step count included) when the block ends.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> before = model.get_weights()
    >>> with state_kept(model):
    ...     _ = model.fit(np.ones((8, 2)), np.ones(8), verbose=0)
    >>> all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    True
    """
    check_model("state_kept", model)
    variables = _variables(model)
    saved = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
    try:
        yield
    finally:
        for v, value in zip(variables, saved):
            v.assign(value)
