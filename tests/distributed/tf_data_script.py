"""Run under horovodrun by tests/distributed/test_tf_data.py: python tf_data_script.py MODES OUTDIR IMAGES.

MODES is one mode or several, comma-separated, run in that order in the same job (one horovodrun start for
the tests that share it). fit: an image_dataset_from_directory pipeline sharded by kfast.data.shard, trained
and evaluated on 2 ranks; each rank writes OUTDIR/fit-rank<r>.json. mismatch: data whose step counts differ
between ranks (tf.data, a PyDataset, a generator) and an unseeded pipeline; each rank prints what each fit
raised."""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import kfast
import kfast.callbacks
from kfast import distributed


class StepCounter(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.steps = []

    def on_epoch_begin(self, epoch, logs=None):
        self.steps.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.steps[-1] += 1


class MeanPrediction(keras.metrics.Metric):
    """A metric of the user's own class (its state is not Keras's): the mean prediction."""

    def __init__(self, name="mean_prediction"):
        super().__init__(name=name)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(keras.ops.cast(y_pred, "float32")))
        self.count.assign_add(keras.ops.cast(keras.ops.size(y_pred), "float32"))

    def result(self):
        return self.total / self.count


def images(directory, seed=1337):
    return keras.utils.image_dataset_from_directory(directory, image_size=(16, 16), batch_size=4, seed=seed,
                                                    verbose=False)


def model_for(optimizer):
    keras.utils.set_random_seed(distributed.rank())  # different on each rank: BroadcastState must fix that
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer, "binary_crossentropy", jit_compile=False,
                  metrics=["accuracy", keras.metrics.AUC(name="auc"), MeanPrediction()])
    return model


def fit(out, directory):
    rank, size = distributed.rank(), distributed.size()
    whole = images(directory)
    train = kfast.data.shard(whole, rank, size)
    model = model_for(distributed.DistributedOptimizer(keras.optimizers.SGD(0.01)))
    counter = StepCounter()
    history = model.fit(train, epochs=2, verbose=0, validation_data=kfast.data.shard(whole, rank, size, mode="all"),
                        callbacks=kfast.distributed.default_callbacks(warmup_epochs=0) + [counter])
    metrics = kfast.callbacks.MetricAverage()
    evaluated = model.evaluate(kfast.data.shard(whole, rank, size, mode="all"), verbose=0, return_dict=True,
                               callbacks=[metrics])
    alone = model.evaluate(whole, verbose=0, return_dict=True)  # this rank alone, on the whole set
    result = {"batches": int(whole.cardinality()), "steps": counter.steps, "weights": [w.tolist() for w in model.get_weights()],
              "evaluate": evaluated, "alone": alone, "val_loss": history.history["val_loss"]}
    with open(os.path.join(out, f"fit-rank{rank}.json"), "w") as f:
        json.dump(result, f)


class Uneven(keras.utils.PyDataset):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return np.ones((2, 16, 16, 3), "float32"), np.ones((2, 1), "float32")


def mismatch(out, directory):
    rank, size = distributed.rank(), distributed.size()
    whole = images(directory)

    def generator():
        for _ in range(3 + rank):
            yield np.ones((2, 16, 16, 3), "float32"), np.ones((2, 1), "float32")

    cases = {"tf.data": whole.shard(size, rank), "PyDataset": Uneven(3 + rank), "generator": generator()}
    for name, data in cases.items():
        model = model_for(distributed.DistributedOptimizer(keras.optimizers.SGD(0.01)))
        start = time.monotonic()
        try:
            model.fit(data, epochs=1, verbose=0, callbacks=kfast.distributed.default_callbacks(warmup_epochs=0))
            print(f"CASE {name}: trained", flush=True)
        except kfast.distributed.UnequalStepsError as e:
            print(f"CASE {name}: after {time.monotonic() - start:.1f} s: {e}", flush=True)
    # An unseeded pipeline: each process shuffles its own way.
    try:
        kfast.data.shard(images(directory, seed=None), rank, size)
        print("CASE unseeded: sharded", flush=True)
    except ValueError as e:
        print(f"CASE unseeded: {e}", flush=True)


if __name__ == "__main__":
    distributed.init()
    modes, out, directory = sys.argv[1:4]
    for mode in modes.split(","):
        {"fit": fit, "mismatch": mismatch}[mode](out, directory)
        print(f"rank {distributed.rank()} done {mode}", flush=True)
