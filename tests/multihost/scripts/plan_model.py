"""The model `kfast plan` is checked with: a wide Dense stack, 2.1M float32 values (8.4 MB of gradients),
whose exchange dominates its compute on a 200 Mbit/s link.

    kfast plan plan_model.py:build ...
"""

import keras
import numpy as np

import kfast

BATCH = 256


def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)], name="wide_mlp")
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", jit_compile=False)
    rng = np.random.default_rng(0)
    data = kfast.data.ArrayDataset(rng.standard_normal((BATCH * 16, 1024)).astype("float32"),
                                   rng.standard_normal((BATCH * 16, 10)).astype("float32"), batch_size=BATCH)
    return model, data
