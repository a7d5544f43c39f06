"""The two engines of kfast.distributed side by side: Horovod on TensorFlow and Keras's distribution on JAX.

    python benchmarks/engine_bench.py                 # .venv (TensorFlow, Horovod) and .venv-jax, as make builds them
    python benchmarks/engine_bench.py --steps 60 --batch 64

Each engine trains the guides' scale-out model (a small CNN: Conv2D, pooling, dropout, two Dense) with
`kfast.DistributedOptimizer` and `default_callbacks` through `model.fit` on a FastLoader, on 1 and on 2
processes started by `kfast launch` (one CPU device per process), each process's batch the same in every run
(weak scaling). The step time is the median over the timed steps after a warm-up epoch, read by a callback in
process 0. Both engines run in this one invocation, one job after the other.

Beside each, the same model and batch on the raw engine, no kfast in the step: Keras's own
`keras.distribution.DataParallel` with `model.fit` on arrays (JAX), and a plain Keras 3 step in a
`tf.function` whose gradients go through `horovod.tensorflow.allreduce` (Horovod, under `horovodrun`). The
last lines give kfast's step time over the raw engine's, without and with the preemption watch.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, os, sys, time
import numpy as np
import keras, kfast

steps, batch, out, watch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "watch"
kfast.distributed.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.MaxPooling2D(), keras.layers.Dropout(0.25), keras.layers.Flatten(),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
compiled = {"jit_compile": False} if keras.backend.backend() == "tensorflow" else {}
model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.01)),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compiled)
size = kfast.distributed.size()
rng = np.random.default_rng(0)
x = rng.normal(size=(steps * batch * size, 28, 28, 1)).astype("float32")
y = rng.integers(0, 10, size=steps * batch * size).astype("int32")


class Steps(keras.callbacks.Callback):
    def on_train_batch_begin(self, b, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, b, logs=None):
        self.times.append(time.perf_counter() - self.start)

    def on_epoch_begin(self, epoch, logs=None):
        self.times = []


timer = Steps()
loader = kfast.data.FastLoader(kfast.data.ArrayDataset(x, y, batch_size=batch), training=True, workers=1)
# "watch": with a checkpoint directory, so RankZeroCheckpoint watches SIGTERM and every step ends in the vote.
callbacks = kfast.distributed.default_callbacks(out + ".ckpt" if watch else None, warmup_epochs=0, monitor="loss")
callbacks += [timer]
model.fit(loader, epochs=2, verbose=0, callbacks=callbacks)  # the first epoch warms up (compiles)
if kfast.distributed.rank() == 0:
    with open(out, "w") as f:
        json.dump({"backend": keras.backend.backend(), "size": size, "median_ms": 1000 * float(np.median(timer.times)),
                   "steps": len(timer.times)}, f)
'''

ENGINES = {"horovod (tensorflow)": (".venv", "tensorflow"), "jax": (".venv-jax", "jax")}

# The raw engines: the same model, data and batch, no kfast anywhere in the process.
RAW_JAX = r'''
import json, os, sys, time
import numpy as np
import jax, keras

steps, batch, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")) > 1:
    keras.distribution.initialize()  # from the launcher's environment, as Keras documents
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
size = jax.process_count()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.MaxPooling2D(), keras.layers.Dropout(0.25), keras.layers.Flatten(),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(jax.process_index())
x = rng.normal(size=(steps * batch, 28, 28, 1)).astype("float32")  # this process's part of every global batch
y = rng.integers(0, 10, size=steps * batch).astype("int32")


class Steps(keras.callbacks.Callback):
    def on_train_batch_begin(self, b, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, b, logs=None):
        self.times.append(time.perf_counter() - self.start)

    def on_epoch_begin(self, epoch, logs=None):
        self.times = []


timer = Steps()
model.fit(x, y, batch_size=batch, epochs=2, verbose=0, shuffle=False, callbacks=[timer])
if jax.process_index() == 0:
    with open(out, "w") as f:
        json.dump({"backend": "jax", "size": size, "median_ms": 1000 * float(np.median(timer.times)),
                   "steps": len(timer.times)}, f)
'''

RAW_HOROVOD = r'''
import json, sys, time
import numpy as np
import horovod.tensorflow as hvd
import keras
import tensorflow as tf

steps, batch, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.MaxPooling2D(), keras.layers.Dropout(0.25), keras.layers.Flatten(),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(0.01)
optimizer.build(model.trainable_variables)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(steps * batch, 28, 28, 1)).astype("float32")
y = rng.integers(0, 10, size=steps * batch).astype("int32")
for v in model.variables:  # Keras 3 variables: Horovod's broadcast_variables wants tf.Variables
    v.assign(hvd.broadcast(v.value, root_rank=0))


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    grads = [hvd.allreduce(g, op=hvd.Average) for g in grads]
    optimizer.apply(grads, model.trainable_variables)
    return loss


times = []
for epoch in range(2):  # the first epoch warms up (traces)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]).numpy()
        times.append(time.perf_counter() - start)
if hvd.rank() == 0:
    with open(out, "w") as f:
        json.dump({"backend": "tensorflow", "size": hvd.size(), "median_ms": 1000 * float(np.median(times)),
                   "steps": len(times)}, f)
'''


def run(venv, backend, processes, steps, batch, workdir, watch):
    script = os.path.join(workdir, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    out = os.path.join(workdir, f"{backend}-{processes}-{watch}.json")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    cmd = [os.path.join(REPO, venv, "bin", "kfast"), "launch", "-np", str(processes), script, str(steps), str(batch),
           out, watch]
    proc = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def run_raw(name, processes, steps, batch, workdir):
    """The raw engine's job: `keras.distribution` under `kfast launch` (its launcher only), or `horovodrun`."""
    venv, backend = ENGINES[name]
    script = os.path.join(workdir, f"raw-{backend}.py")
    with open(script, "w") as f:
        f.write(RAW_JAX if backend == "jax" else RAW_HOROVOD)
    out = os.path.join(workdir, f"raw-{backend}-{processes}.json")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS="--xla_force_host_platform_device_count=1")
    bin_dir = os.path.join(REPO, venv, "bin")
    if backend == "jax":
        cmd = [os.path.join(bin_dir, "kfast"), "launch", "-np", str(processes), script, str(steps), str(batch), out]
    else:
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        cmd = [os.path.join(bin_dir, "horovodrun"), "-np", str(processes), "-H", f"localhost:{processes}",
               os.path.join(bin_dir, "python"), script, str(steps), str(batch), out]
    proc = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch (default 40)")
    parser.add_argument("--batch", type=int, default=64, help="samples per process and step (default 64)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kfast-engine-bench-") as workdir:
        for name, (venv, backend) in ENGINES.items():
            for processes in (1, 2):
                rows.append((name, "raw", run_raw(name, processes, args.steps, args.batch, workdir)))
            for watch in ("plain", "watch"):
                for processes in (1, 2):
                    rows.append((name, watch, run(venv, backend, processes, args.steps, args.batch, workdir, watch)))
    print(f"scale-out CNN, batch {args.batch} per process, {args.steps} steps per epoch, median of the second epoch")
    print("raw: the engine alone (keras.distribution / horovod.tensorflow in a plain step); plain: kfast with "
          "default_callbacks() without checkpoints; watch: with a checkpoint directory (SIGTERM watched, a vote "
          "every step)")
    print(f"{'engine':<22}{'callbacks':>10}{'processes':>10}{'step ms':>10}{'samples/s':>12}{'vs 1 process':>14}")
    one = {}
    for name, watch, r in rows:
        samples = args.batch * r["size"] / (r["median_ms"] / 1000)
        one.setdefault((name, watch), samples)
        print(f"{name:<22}{watch:>10}{r['size']:>10}{r['median_ms']:>10.2f}{samples:>12.0f}"
              f"{samples / one[(name, watch)]:>13.2f}x")
    by = {(name, watch, r["size"]): r["median_ms"] for name, watch, r in rows}
    for name in ENGINES:
        for watch in ("plain", "watch"):
            for processes in (1, 2):
                ratio = by[(name, watch, processes)] / by[(name, "raw", processes)]
                print(f"{name}, kfast {watch}, {processes} process(es): step time / raw engine's = {ratio:.2f}")
    for watch in ("plain", "watch"):
        for processes in (1, 2):
            ratio = by[("jax", watch, processes)] / by[("horovod (tensorflow)", watch, processes)]
            print(f"{watch}, {processes} process(es): JAX step time / Horovod step time = {ratio:.2f}")


if __name__ == "__main__":
    main()
