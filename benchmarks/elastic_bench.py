"""Commit overhead of elastic training: `kfast.distributed.elastic_fit` against `model.fit`, in one run.

Same model, data and loader settings; alternating rounds; steps/s of the epochs after the first. A commit
copies the weights and optimizer state to host memory and asks rank 0 whether hosts changed (one small
broadcast), so its cost per step is about (copy + broadcast) / commit_every.

    python benchmarks/elastic_bench.py                                   # one process
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/elastic_bench.py   # two ranks
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import statistics  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfast  # noqa: E402

BATCH, BATCHES, EPOCHS, ROUNDS = 64, 64, 3, 3
WIDTH = 512  # 512-wide Dense layers: about 0.8 M values of weights and twice that of Adam state


class EpochClock(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = getattr(self, "times", [])

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append((time.perf_counter() - self._start, self.params["steps"]))


def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(WIDTH, activation="relu"), keras.layers.Dense(10)])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.Adam(1e-3)), "mse", jit_compile=False)
    return model


def data():
    rng = np.random.default_rng(0)
    return kfast.data.ArrayDataset(rng.standard_normal((BATCH * BATCHES, WIDTH)).astype("float32"),
                                   rng.standard_normal((BATCH * BATCHES, 10)).astype("float32"), batch_size=BATCH)


def steps_per_s(clock):
    times = clock.times[1:]  # the first epoch traces the step
    return sum(steps for _, steps in times) / sum(seconds for seconds, _ in times)


def plain(dataset):
    model, clock = build(), EpochClock()
    with kfast.data.FastLoader(dataset, training=True, workers=1, use_multiprocessing=False) as loader:
        model.fit(loader, epochs=EPOCHS, verbose=0, callbacks=[kfast.callbacks.BroadcastState(), clock])
    return steps_per_s(clock)


def elastic(dataset, commit_every):
    model, clock = build(), EpochClock()
    kfast.distributed.elastic_fit(model, dataset, epochs=EPOCHS, commit_every=commit_every, workers=1,
                                  use_multiprocessing=False, verbose=0, callbacks=[clock])
    return steps_per_s(clock)


def main():
    import kfast.callbacks  # noqa: F401

    kfast.distributed.init()
    dataset = data()
    runs = {"model.fit": [], "elastic_fit commit_every=20": [], "elastic_fit commit_every=5": [],
            "elastic_fit commit_every=1": []}
    for _ in range(ROUNDS):  # alternating, so drift in the machine's load hits every variant alike
        runs["model.fit"].append(plain(dataset))
        for every in (20, 5, 1):
            runs[f"elastic_fit commit_every={every}"].append(elastic(dataset, every))
    if kfast.distributed.is_chief():
        base = statistics.median(runs["model.fit"])
        print(f"{kfast.distributed.size()} rank(s), {BATCHES} batches of {BATCH} per epoch, {ROUNDS} rounds (median)")
        for name, rates in runs.items():
            rate = statistics.median(rates)
            print(f"  {name:<30} {rate:7.1f} steps/s  {rate / base:5.2f}x model.fit  "
                  f"({(1 / rate - 1 / base) * 1e3:+.2f} ms per step)")


if __name__ == "__main__":
    main()
