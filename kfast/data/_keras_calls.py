"""What Keras's `evaluate` and `predict` read from data that kfast shards over ranks.

NOTE [ Evaluation reads the whole set ]
Under Horovod a FastLoader shards itself: each rank trains on its own batches, which is what `fit` wants.
`evaluate` and `predict` want the opposite: one process's answer over the whole set, on every rank, as
tf.distribute gives it. Keras tells a dataset nothing about which call reads it (fit, evaluate and predict
all build the same adapter with `shuffle=False` for the last two), so kfast wraps `keras.Model.evaluate` and
`keras.Model.predict` (fit's validation goes through `evaluate`) and, for the duration of the call, tells the
FastLoader passed in what to read:

- every batch, in index order, on every rank (`WHOLE`): the metrics and predictions are one process's on the
  whole set, bit for bit, and no collective runs, so a rank may evaluate alone. The price: each rank
  computes the whole evaluation.
- batches rank, rank + size, ... (`SHARE`, every batch once over the ranks) when the call's callbacks sum
  the metric states over the ranks (`kfast.callbacks.MetricAverage`, in `default_callbacks`): each rank
  evaluates its share and the sums give the exact result.

On the JAX engine one step is one program over every process's part of a global batch: evaluate and predict
read `SHARE` always, and predict's outputs are gathered to every process (`_gathered_predict`).

A tf.data pipeline sharded with `kfast.data.shard(..., mode="all")` cannot be read whole again: its
`evaluate` is summed over the ranks here, after Keras's loop, from the metric states (a collective).
Evaluating or predicting on what is one rank's part only (a "drop" or "pad" shard, a `ShardedDataset`)
warns once, naming the fix. A loop of your own over a loader reads this rank's shard: kfast cannot tell.

Nothing else depends on the wrap: were it gone (a Keras release that renames the methods),
tests/data/test_keras_calls.py fails, and every rank would evaluate its own shard as before.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

from kfast._core import topology
from kfast.data._loader_order import SHARE, WHOLE

_warned: set[str] = set()


def _callbacks(bound: inspect.BoundArguments) -> list[Any]:
    given = bound.arguments.get("callbacks")
    return list(getattr(given, "callbacks", given) or [])


def _sums_states(callbacks: list[Any]) -> bool:
    return any(getattr(c, "sums_metric_states", False) for c in callbacks)


def _warn_once(kind: str, what: str, fix: str) -> None:
    if kind in _warned:
        return
    _warned.add(kind)
    warnings.warn(f"{what} under {topology.size()} ranks gives each rank its own part's result (rank "
                  f"{topology.rank()} here), not the whole set's; {fix}", stacklevel=4)


def _summed_evaluate(original: Any, model: Any, bound: inspect.BoundArguments) -> Any:
    """evaluate() over an "all" shard, its metric states summed over the ranks after Keras's loop."""
    import keras

    from kfast.distributed.metric_state import sum_metric_states

    return_dict = bound.arguments.get("return_dict", False)
    bound.arguments["return_dict"] = True
    original(*bound.args, **bound.kwargs)
    sum_metric_states(model)
    logs = {k: float(keras.ops.convert_to_numpy(v)) if keras.ops.ndim(v) == 0 else keras.ops.convert_to_numpy(v)
            for k, v in model.get_metrics_result().items()}
    return logs if return_dict else model._flatten_metrics_in_order(logs)


def _check_even(kind: str, batches: int, batch_size: Any) -> None:
    """On the JAX engine each step is one program over every process: a process with one batch more than the
    others would wait for them for ever, so an uneven split is an error, on every process alike."""
    size = topology.size()
    if batches % size:
        samples = f"; with batches of {batch_size}, a multiple of {batch_size * size} samples" if batch_size else ""
        raise ValueError(f"{kind}() on the JAX engine reads a FastLoader of {batches} batches over {size} processes, "
                         f"and each step is one program over all of them, so every process needs the same number of "
                         f"batches, all full: give it a multiple of {size} batches{samples} (the last batch full).")


def _gathered_predict(original: Any, model: Any, args: Any, kwargs: Any) -> Any:
    """predict() over several JAX processes: each step's outputs are one global array spread over every
    process's devices, which Keras's loop cannot turn into numpy; they are gathered to every process first
    (JAX's `process_allgather`), as process 0's part, then process 1's, ...: the loader's batch order.

    Keras keeps the compiled step in `predict_function` (made by `make_predict_function`, which predict()
    reuses); it is wrapped for the call and put back after. tests/distributed/jax_collectives.py checks the
    predictions, so a Keras that renames either fails there."""
    from jax.experimental import multihost_utils
    from jax import tree_util

    model.make_predict_function()
    step = model.predict_function

    def gathered(state: Any, iterator: Any) -> Any:
        outputs, state = step(state, iterator)
        return tree_util.tree_map(lambda o: multihost_utils.process_allgather(o, tiled=True), outputs), state

    model.predict_function = gathered
    try:
        return original(model, *args, **kwargs)
    finally:
        model.predict_function = step


def _wrap(original: Any, kind: str) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(model: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(model, *args, **kwargs)
        except TypeError:
            return original(model, *args, **kwargs)  # Keras's own error for bad arguments
        x: Any = bound.arguments.get("x")
        reading = getattr(x, "_keras_reading", None)
        together = topology.one_step_for_all() and topology.size() > 1
        if kind == "predict" and together and reading is None:
            raise ValueError(
                f"predict() over {topology.size()} JAX processes got {type(x).__name__}; it reads a "
                "kfast.data.FastLoader, whose batches it deals over the processes (each step predicts one batch "
                "per process, and every process gets the whole result in the loader's order). Wrap the data in "
                "one: model.predict(kfast.data.FastLoader(kfast.data.ArrayDataset(x, batch_size=32))).")
        if reading is not None:  # a FastLoader
            # On the JAX engine one step reads every process's part of a global batch, for all three calls.
            sums = kind == "evaluate" and _sums_states(_callbacks(bound)) or topology.one_step_for_all()
            if topology.one_step_for_all() and topology.size() > 1:
                _check_even(kind, len(x.dataset), getattr(x.dataset, "batch_size", None))
            if x._sharded_by_hand() and topology.size() > 1 and not sums:
                _warn_once(f"{kind}-given", f"{kind}() on a FastLoader over a ShardedDataset",
                           "pass the dataset itself to FastLoader, which reads the whole set in evaluate and predict.")
            with reading(SHARE if sums else WHOLE):
                if kind == "predict" and together:
                    return _gathered_predict(original, model, args, kwargs)
                return original(model, *args, **kwargs)
        mark = getattr(x, "_kfast_shard", None)
        if mark is None or mark.size == 1:
            return original(model, *args, **kwargs)
        if kind == "predict":
            _warn_once("predict-tf", "predict() on a pipeline sharded by kfast.data.shard",
                       "predict on the unsharded pipeline (or gather the parts with "
                       "kfast.distributed.allgather_object).")
        elif mark.mode != "all":
            _warn_once("evaluate-tf", f"evaluate() on a kfast.data.shard(..., mode={mark.mode!r}) pipeline, which "
                       "leaves batches out,", "shard it with mode=\"all\" (every batch once; kfast then sums the "
                       "metrics over the ranks).")
        elif not _sums_states(_callbacks(bound)):
            return _summed_evaluate(original, model, bound)
        return original(model, *args, **kwargs)

    call.__kfast_wrapped__ = True  # type: ignore[attr-defined]
    return call


def install(model_class: Any) -> None:
    """Wraps `model_class.evaluate` and `.predict` (Keras's `Model`), once."""
    for kind in ("evaluate", "predict"):
        original = getattr(model_class, kind)
        if not getattr(original, "__kfast_wrapped__", False):
            setattr(model_class, kind, _wrap(original, kind))
