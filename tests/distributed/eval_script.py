"""Run under horovodrun by tests/distributed/test_evaluate.py: python eval_script.py OUTDIR.

Each rank evaluates and predicts with plain Keras calls on a FastLoader (the script's first one built inside the
call, as a script that evaluates a saved model does), and on a tf.data shard with MetricAverage, and writes
OUTDIR/rank<r>.json beside what the same model gives on the whole set as one process would (numpy arrays,
which kfast never shards). The model's weights are the same on every rank (one seed)."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import kfast
import kfast.callbacks
from kfast import distributed

N, B = 103, 10  # 11 batches, the last of 3 samples: unequal shares over 2 ranks


class MeanOfTargets(keras.metrics.Metric):
    """A user's metric class: a total and a count, which add up over samples."""

    def __init__(self, name="mean_of_targets", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = keras.ops.cast(y_true, "float32")
        self.total.assign_add(keras.ops.sum(y_true * 3.0))
        self.count.assign_add(keras.ops.cast(keras.ops.size(y_true), "float32"))

    def result(self):
        return self.total / self.count


def data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x[:, :1] + 0.3 * rng.normal(size=(n, 1)) > 0).astype("float32")


def make_model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.1)), "binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"), MeanOfTargets()], jit_compile=False)
    return model


def loader(x, y=None, batch_size=B, training=False):
    return kfast.data.FastLoader(kfast.data.ArrayDataset(x, y, batch_size=batch_size), training=training, workers=1,
                                 use_multiprocessing=False)


def main(out):
    distributed.init()
    r = distributed.rank()
    x, y = data()
    vx, vy = data(37, seed=1)
    model = make_model()
    px = x[:40]
    # The first FastLoaders of the script, built inside the calls (Python looks model.evaluate up first).
    result = {"fresh": model.evaluate(kfast.data.FastLoader(kfast.data.ArrayDataset(x, y, batch_size=B)), verbose=0,
                                      return_dict=True),
              "fresh_predict": model.predict(kfast.data.FastLoader(kfast.data.ArrayDataset(px, batch_size=6)),
                                             verbose=0).ravel().tolist()}
    result["reference"] = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    with loader(x, y) as test:
        result["plain"] = model.evaluate(test, verbose=0, return_dict=True)
        result["plain_list"] = model.evaluate(test, verbose=0)
        result["len_outside"] = len(test)
        with loader(x, y, training=True) as train:
            result["len_training"] = len(train)
        result["summed"] = model.evaluate(test, verbose=0, return_dict=True,
                                          callbacks=[kfast.callbacks.MetricAverage()])
    # predict: 40 samples in batches of 6, the seventh batch short.
    result["predict_reference"] = model.predict(px, batch_size=6, verbose=0).ravel().tolist()
    with loader(px, batch_size=6) as inputs:
        result["predict"] = model.predict(inputs, verbose=0).ravel().tolist()

    # fit's validation, without kfast's callbacks and with them; the reference: the trained weights on the
    # whole validation set, as one process evaluates it.
    for name, callbacks in [("val_plain", [kfast.callbacks.BroadcastState()]),
                            ("val_default", distributed.default_callbacks(warmup_epochs=0))]:
        model = make_model()
        with loader(x, y, training=True) as train, loader(vx, vy) as val:
            history = model.fit(train, validation_data=val, epochs=1, verbose=0, callbacks=callbacks)
        result[name] = {k: v[-1] for k, v in history.history.items() if k.startswith("val_")}
        result[name + "_reference"] = {f"val_{k}": v for k, v in model.evaluate(
            vx, vy, batch_size=B, verbose=0, return_dict=True).items()}

    # fit on a loader every rank reads whole: an error on every rank, naming the fix.
    model = make_model()
    try:
        with loader(x, y) as whole:
            model.fit(whole, epochs=1, verbose=0, callbacks=[kfast.callbacks.BroadcastState()])
        result["whole_fit_error"] = None
    except ValueError as e:
        result["whole_fit_error"] = str(e)

    # tf.data: an "all" shard (every batch once over the ranks) evaluates globally with MetricAverage.
    import tensorflow as tf

    model = make_model()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(B)
    result["tf_all"] = model.evaluate(kfast.data.shard(ds, r, distributed.size(), mode="all"), verbose=0,
                                      return_dict=True, callbacks=[kfast.callbacks.MetricAverage()])
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
