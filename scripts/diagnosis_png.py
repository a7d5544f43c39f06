"""Draws docs/diagnosis.png, the diagnosis picture in README.md and docs/diagnosis.md.

A small classifier fed by a plain `keras.utils.PyDataset` whose `__getitem__` costs 10 ms a batch (a sleep
standing in for decoding and augmenting images), diagnosed on CPU: the input-bound case `kfast.diagnose`
exists for. Takes about 15 seconds.

Usage: .venv/bin/python scripts/diagnosis_png.py [PNG]    (default: docs/diagnosis.png in this checkout)
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfast  # noqa: E402


class SlowBatches(keras.utils.PyDataset):
    """100 batches of 64 samples x 32 features; each batch takes 10 ms to 'decode'."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(64, 32)).astype("float32")
        self.y = (self.x[:, :4].sum(axis=1) > 0).astype("int32")

    def __len__(self):
        return 100

    def __getitem__(self, i):
        time.sleep(0.010)
        return self.x + np.float32(i % 5), self.y


def main(path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "diagnosis.png")):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = kfast.diagnose(model, SlowBatches(), steps=40, warmup=5)
    print(result)
    result.plot(path)
    print(f"wrote {os.path.normpath(path)} ({os.path.getsize(path) // 1024} KB)")


if __name__ == "__main__":
    main(*sys.argv[1:])
