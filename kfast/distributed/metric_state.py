"""Global evaluation metrics under Horovod: each rank evaluates its own shard, and the metrics come out as
evaluating every rank's samples in one process would give them.

A Keras metric keeps its running state in variables that add up over samples (a Mean's total and count,
AUC's confusion counts, a Precision's true and false positives), and computes its result from them. So
the element-wise sum of every rank's state is the state one process would have reached over all the
samples, and the result computed from it is exact: partial batches and shards of unequal size included,
where averaging the ranks' results would not be.
"""

from __future__ import annotations

import keras
import numpy as np

from kfast._core import topology
from kfast.distributed import collectives


def sum_metric_states(model: keras.Model) -> None:
    """Replaces the state of each of `model.metrics` by its sum over ranks, so that
    `model.get_metrics_result()` gives the whole job's results. A collective: every rank calls it, with
    the same model. One process is left as it is.

    Args:
        model: the model whose metrics hold this rank's state.

    Example:

    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse", metrics=["mae"])
    >>> before = model.evaluate(np.ones((4, 2)), np.ones(4), verbose=0, return_dict=True)
    >>> sum_metric_states(model)  # one process: nothing to add
    >>> {k: float(v) for k, v in model.get_metrics_result().items()} == before
    True
    """
    if collectives.size() == 1 or topology.one_step_for_all():
        return  # one process's states; or the JAX engine's, the whole job's already (kfast/distributed/_jax.py)
    variables = [v for metric in model.metrics for v in metric.variables]
    if not variables:
        return
    values = [np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64) for v in variables]
    total = np.asarray(collectives.allreduce_sum_values(np.concatenate([v.ravel() for v in values]).tolist()))
    at = 0
    for v, value in zip(variables, values):
        v.assign(total[at:at + value.size].reshape(value.shape).astype(v.dtype))
        at += value.size
