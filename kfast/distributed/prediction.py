"""predict over several JAX processes: every process gets the whole set's outputs, in the loader's order.

Keras's `predict` turns each step's outputs into numpy, and on the JAX engine an output spans every process's
devices, which no one process can read; Keras offers no hook between the step and that conversion. So kfast
offers the call explicitly: `kfast.distributed.predict(model, loader)` runs the model's own forward pass
(`model.stateless_call`, compiled once) on each global batch and gathers every output to every process
(JAX's `process_allgather`), process 0's part first: the loader's batch order. Under Horovod and in one
process it is `model.predict(loader)`, which reads a whole-set FastLoader on every rank already.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kfast._core import topology


def predict(model: Any, x: Any, *, verbose: int | str = "auto") -> Any:
    """Returns `model`'s predictions for every sample of `x`, in order, on every process.

    Args:
        model: a built Keras model.
        x: a `kfast.data.FastLoader` (any data `model.predict` takes, under Horovod or in one process).
        verbose: as `model.predict`'s (one process, Horovod). Defaults to `"auto"`.

    Returns:
        The outputs as numpy arrays (a structure of them for several outputs), one row per sample.

    Raises:
        ValueError: on several JAX processes, for `x` that is not a FastLoader.

    Example:

    >>> import keras, numpy as np, kfast
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    >>> data = kfast.data.FastLoader(kfast.data.ArrayDataset(np.ones((6, 2)), batch_size=4))
    >>> kfast.distributed.predict(model, data, verbose=0).ravel().tolist()
    [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    """
    if not (topology.one_step_for_all() and topology.size() > 1):
        return model.predict(x, verbose=verbose)
    if not hasattr(x, "get_jax_iterator"):
        raise ValueError(f"kfast.distributed.predict over {topology.size()} JAX processes got {type(x).__name__}; it "
                         "reads a kfast.data.FastLoader, which deals the batches over the processes: "
                         "kfast.distributed.predict(model, kfast.data.FastLoader(kfast.data.ArrayDataset(x, batch_size=32))).")
    import jax
    import keras
    from jax.experimental import multihost_utils

    distribution = keras.distribution.distribution()

    @jax.jit
    def forward(trainable: Any, non_trainable: Any, inputs: Any) -> Any:
        return model.stateless_call(trainable, non_trainable, inputs, training=False)[0]

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    outputs: list[Any] = []
    x.on_epoch_begin()
    for batch in x.get_jax_iterator():
        inputs = batch[0] if isinstance(batch, tuple) else batch

        def global_array(local: Any) -> Any:
            local = np.asarray(local)
            layout = distribution.get_data_layout((local.shape[0] * topology.size(), *local.shape[1:]))
            return jax.make_array_from_process_local_data(layout.backend_layout, local)

        out = forward(trainable, non_trainable, jax.tree_util.tree_map(global_array, inputs))
        outputs.append(jax.tree_util.tree_map(
            lambda o: np.asarray(multihost_utils.process_allgather(o, tiled=True)), out))
    x.on_epoch_end()
    return jax.tree_util.tree_map(lambda *parts: np.concatenate(parts), *outputs)
