"""A user's own `keras.distribution.DataParallel()` over JAX processes, without kfast.distributed.init(), under
`kfast launch -np 2` (tests/distributed/test_jax_engine.py): Keras shards a PyDataset itself but passes a
FastLoader (a data adapter) through, so the loader follows Keras's split. Each process prints one REPORT line:
the dataset batches its loader serves (`loader[i]`, in index order: batch i's targets hold i), and the steps fit
ran."""

import json

import jax
import keras
import numpy as np

jax.config.update("jax_cpu_collectives_implementation", "gloo")
keras.distribution.initialize()  # from kfast launch's environment, as Keras documents
keras.distribution.set_distribution(keras.distribution.DataParallel())  # auto_shard_dataset=True, Keras's default

import kfast  # noqa: E402


class Indexed(keras.utils.PyDataset):
    """Batch i holds the value i."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((4, 2), i, "float32"), np.full((4, 1), i, "float32")


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
steps = Steps()
with kfast.data.FastLoader(Indexed(), training=True, workers=1, use_multiprocessing=False, seed=3) as loader:
    model.fit(loader, epochs=2, verbose=0, callbacks=[steps])
    serves = [int(loader[i][1][0, 0]) for i in range(len(loader))]
print("REPORT " + json.dumps({"rank": jax.process_index(), "serves": serves, "steps": steps.steps}), flush=True)
