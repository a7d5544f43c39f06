"""Timed training through `model.fit`'s own step, leaving the model as it was.

`kfast.diagnose` times the model alone and end to end, `kfast.tune(model=...)` scores each loader setting
by the steps/s training reaches with it, and `kfast.plan` times the compute of one step; all of them hand
the model back untouched, all of them refuse a model they cannot train and put back in one way, and all of
them build a model that is not built yet from the data's first batch, as `fit` does.

NOTE [ Building as fit does ]: a subclassed model (layers made in `__init__`, used in `call`, no
`keras.Input`) has no variables until it is called, and `model.build(input_shape)` on one marks it built
while its layers still have none. `fit` builds such a model from its first batch: Keras's trainers call
`Trainer._symbolic_build`, which traces the model, the compiled loss and metrics on symbolic tensors shaped
like the batch and then builds the optimizer for the variables that made. Its weights can only be saved and
put back after that, and an optimizer built before it would know none of them (Keras then refuses to apply
gradients: "Unknown variable"). `build_from_batch` calls that same method (a private one: it is the only
way to build exactly as fit does, on every backend), so the block of `state_kept` that follows sees every
variable training will touch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kfast._core import keras_private
from kfast._core.tf_datasets import is_tf_dataset


class StepClock(keras.callbacks.Callback):
    """Stamps the end of every training step and stops training after `most` steps, or once `seconds` have
    passed since the `warmup`-th step (and at least 3 steps were timed).

    Args:
        most: the most steps to train, warm-up included.
        warmup: steps before the timing starts (the first one traces the step). Defaults to `0`.
        seconds: stop after this long, counted from the end of warm-up. Defaults to `None`: after `most`.
        deadline: stop once `time.perf_counter()` passes this, warm-up included. Defaults to `None`.
        least: timed steps to take before `seconds` or `deadline` may stop training. Defaults to `3`.
    """

    def __init__(self, most: int, *, warmup: int = 0, seconds: float | None = None, deadline: float | None = None,
                 least: int = 3) -> None:
        super().__init__()
        self.most, self.warmup, self.seconds, self.deadline, self.least = most, warmup, seconds, deadline, least
        self.stamps: list[float] = []
        self.stopped = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.stamps, self.stopped = [time.perf_counter()], False

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        self.stamps.append(now)
        steps = len(self.stamps) - 1
        timed = steps - self.warmup
        late = ((self.seconds is not None and timed > 0 and now - self.stamps[self.warmup] >= self.seconds)
                or (self.deadline is not None and now >= self.deadline))
        if steps >= self.most or (late and timed >= self.least):
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


def timed_fit(model: keras.Model, data: Any, clock: StepClock,
              callbacks: list[keras.callbacks.Callback] | None = None) -> StepClock:
    """Trains `model` on `data` until `clock` stops it; data shorter than that is read for the passes the
    clock's `most` steps need and no more, as training would. `model.history` is left as it was."""
    length = batches_per_epoch(data)
    history = getattr(model, "history", None)
    # Keras shuffles a PyDataset's batch order by default, as training does; a tf.data pipeline shuffles
    # itself, and fit warns when asked to.
    kwargs = {"verbose": 0, "callbacks": [clock] + list(callbacks or []), "shuffle": not is_tf_dataset(data)}
    try:
        if length is None:
            model.fit(data, epochs=1, steps_per_epoch=clock.most, **kwargs)
        else:
            # Whole epochs rather than steps_per_epoch > length, which Keras ends early with "ran out of data".
            model.fit(data, epochs=math.ceil(clock.most / length), **kwargs)
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


def first_batch(data: Any) -> Any:
    """The first batch of `data`: `data[0]` of a PyDataset-like object, else the first one its iteration
    yields (a FastLoader's prefetched stream, a `tf.data.Dataset`, any iterable).

    Example:

    >>> first_batch([np.zeros((2, 3))]).shape
    (2, 3)
    """
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not hasattr(data, "wait_seconds"):
        if len(data):
            return data[0]
    else:
        for batch in data:
            return batch
    raise ValueError(f"got {type(data).__name__} with no batches; pass the data you train on.")


def _unbuilt(model: keras.Model, metrics: bool = False) -> bool:
    # model.build() on a subclassed model marks the model built while its layers are not (see the NOTE above).
    # Keras's JAX fit builds the compiled loss and metrics from a first look at the data when either is unbuilt,
    # which would take the first batch of a resumed epoch: a model compiled without metrics has only the loss.
    if metrics and not keras_private.compiled_loss_and_metrics_built(model):
        return True
    return not model.built or not all(layer.built for layer in keras_private.sublayers(model, recursive=True))


def build_from_batch(model: keras.Model, batch: Any, caller: str = "kfast", metrics: bool = False) -> None:
    """Builds what `fit` builds from its first batch, when the model is not built yet: the layers' variables,
    the compiled loss and metrics, and the optimizer for those variables (see NOTE [ Building as fit does ]).
    A built model is left alone; with `metrics`, one whose compiled metrics are not built is not.

    Raises:
        ValueError: when the model cannot be built from `batch` (Keras's own error, as its cause).

    Example:

    >>> model = keras.Sequential([keras.layers.Dense(1)])  # no keras.Input: no variables yet
    >>> model.compile("adam", "mse")
    >>> build_from_batch(model, (np.ones((8, 3), "float32"), np.ones((8, 1), "float32")))
    >>> [tuple(v.shape) for v in model.weights], model.optimizer.built
    ([(3, 1), (1,)], True)
    """
    if not _unbuilt(model, metrics):
        return
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's, where its variables must be made
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        try:
            keras_private.symbolic_build(model, batch)
        except (ValueError, RuntimeError) as e:
            shapes = [tuple(np.shape(leaf)) for leaf in keras.tree.flatten(batch)]
            raise ValueError(f"{caller} got model {model.name!r}, not built yet, and building it from the data's "
                             f"first batch (shapes {shapes}), as fit does, failed: {e} Check that the batch is what "
                             "the model's call() expects, or build the model first.") from e


def build_if_needed(caller: str, model: Any, data: Any) -> None:
    """Checks that `model` is compiled, and builds it from the first batch of `data` when it is not built
    yet, as `fit` would (`build_from_batch`); the first batch is read only then.

    Raises:
        ValueError: for a model that is not compiled, or data without batches.
    """
    check_model(caller, model, built=False)
    if _unbuilt(model):
        build_from_batch(model, first_batch(data), caller)


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
