"""Short timed bursts of real training through `model.fit`, leaving the model as it was.

`kfast.tune(model=...)` scores each loader setting by the steps/s training reaches with it, and
`kfast.diagnose` times the model alone; both must hand the model back untouched.
"""

import contextlib
import math
import time

import keras
import numpy as np


class _Burst(keras.callbacks.Callback):
    """Counts steps after `warmup` of them and stops training once `seconds` have passed (and 3 steps)."""

    def __init__(self, warmup, seconds, most):
        super().__init__()
        self.warmup, self.seconds, self.most = warmup, seconds, most
        self.steps, self.start, self.end = 0, None, None

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        now = time.perf_counter()
        if self.steps == self.warmup:
            self.start = now
            return
        counted = self.steps - self.warmup
        if self.start is not None and counted >= 3 and (now - self.start >= self.seconds or counted >= self.most):
            self.end = now
            self.model.stop_training = True

    def rate(self):
        if self.end is None:
            raise RuntimeError(f"the training burst ended after {self.steps} steps, before it was timed.")
        return (self.steps - self.warmup) / (self.end - self.start)


def steps_per_s(model, data, *, warmup=2, seconds=1.0):
    """Training steps/s of compiled `model` fed by `data` (a PyDataset such as a FastLoader), timed after
    `warmup` steps (the first traces the step) for about `seconds`, at most 20 passes over `data`."""
    length = len(data)
    most = 20 * length
    burst = _Burst(warmup, seconds, most)
    # Enough epochs to cover warm-up and the longest burst; the callback ends training earlier.
    epochs = math.ceil((warmup + most + 1) / length)
    history = getattr(model, "history", None)
    try:
        model.fit(data, epochs=epochs, verbose=0, callbacks=[burst])
    finally:
        model.history = history  # fit replaced it with the burst's
    return burst.rate()


def check_model(caller, model):
    """Raises ValueError unless `model` can be trained in bursts and put back: compiled and built."""
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"{caller} got model={model!r}, which is not compiled; call model.compile(...) first.")
    if not model.built:
        raise ValueError(f"{caller} got model {model.name!r}, which is not built yet, so its weights cannot be saved "
                         "and put back; build it first (keras.Input in the model, model.build(input_shape), or "
                         "call it on one batch).")


def _variables(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        # Slots made during the block (Adam's moments, ...) would keep what the block trained into them.
        optimizer.build(model.trainable_variables)
    return list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])


@contextlib.contextmanager
def state_kept(model):
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
