"""kfast's memory prediction side by side with a measured peak: XLA's own analysis of the compiled step on JAX,
the process's peak resident memory on TensorFlow (CPU).

    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/memory_bench.py    # prediction vs XLA's compiled step
    .venv/bin/python benchmarks/memory_bench.py                           # prediction vs TensorFlow on CPU

On JAX nothing runs: `kfast.planning.compiled_step_memory` compiles the training step as Keras's trainer does
and reads XLA's buffer assignment; its `total` (arguments + working memory + outputs not written over the
donated state) is compared with kfast's predicted peak, in float32 and in mixed_bfloat16.

On TensorFlow each case runs in a fresh process: the model is built and trained for one step on a batch of one
(its weights and optimizer slots now exist), the resident memory is read, then one step at the batch size runs
and the process's peak resident memory (`ru_maxrss`) is read. The growth is compared with what kfast predicts
the step adds to what was there: gradients, activations and the batch. A rough check: TensorFlow's allocator,
its thread pools and numpy's copies of the batch are in the measurement too.
"""

import json
import os
import resource
import subprocess
import sys

import keras
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from test_plan_memory_xla import MODELS  # noqa: E402 - the models the suite validates

from kfast.planning import compiled_step_memory  # noqa: E402
from kfast.planning import estimate_memory  # noqa: E402

BATCHES = (16, 64, 256)


def cnn_max_pooling():
    """The classic small CNN, max pooling between convolutions (XLA on CPU expands its backward pass)."""
    model = keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


ALL = {**MODELS, "cnn_max_pooling": cnn_max_pooling}


def batch_of(model, n):
    spec = model.inputs[0]
    rng = np.random.default_rng(0)
    dtype = keras.backend.standardize_dtype(spec.dtype)
    shape = (n,) + tuple(spec.shape[1:])
    x = rng.integers(0, 1000, shape).astype(dtype) if "int" in dtype else rng.standard_normal(shape).astype(dtype)
    return x, rng.integers(0, 10, n).astype("int32")


def mb(n):
    return f"{n / 1e6:,.1f} MB"


def against_xla():
    print(f"jax {__import__('jax').__version__}, keras {keras.__version__}: kfast's predicted peak against XLA's "
          "compiled step (arguments + temp + outputs not aliased)\n")
    print(f"| model | precision | batch | predicted | XLA | error | predicted activations | XLA temp - gradients |")
    print("|---|---|---|---|---|---|---|---|")
    for policy in ("float32", "mixed_bfloat16"):
        keras.config.set_dtype_policy(policy)
        for name, build in ALL.items():
            for n in BATCHES:
                keras.utils.set_random_seed(0)
                model = build()
                batch = batch_of(model, n)
                p = estimate_memory(model, batch)
                x = compiled_step_memory(model, batch)
                print(f"| {name} | {policy} | {n} | {mb(p.peak)} | {mb(x.total)} | {p.peak / x.total - 1:+.1%} | "
                      f"{mb(p.activations)} | {mb(x.temp - p.gradients)} |", flush=True)
    keras.config.set_dtype_policy("float32")


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_case(name, n):
    """Runs in a child process: the growth of peak resident memory over one training step at batch `n`."""
    keras.utils.set_random_seed(0)
    model = ALL[name]()
    model.train_on_batch(*batch_of(model, 1))  # weights and optimizer slots exist; the step is traced
    x, y = batch_of(model, n)
    predicted = estimate_memory(model, (x, y))
    before = max(_rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    model.train_on_batch(x, y)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    adds = predicted.gradients + predicted.activations + predicted.batch
    print(json.dumps({"measured": peak - before, "predicted": adds}))


def against_tensorflow():
    print(f"tensorflow, keras {keras.__version__}: growth of the process's peak resident memory over one step, "
          "against kfast's gradients + activations + batch\n")
    print("| model | batch | predicted | measured | error |")
    print("|---|---|---|---|---|")
    for name in ALL:
        for n in (64, 256, 1024):
            out = subprocess.run([sys.executable, __file__, "--case", name, str(n)], capture_output=True, text=True,
                                 timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if out.returncode:
                print(f"| {name} | {n} | failed: {out.stderr.strip().splitlines()[-1]} | | |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {name} | {n} | {mb(r['predicted'])} | {mb(r['measured'])} | "
                  f"{r['predicted'] / max(r['measured'], 1) - 1:+.0%} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--case":
        one_case(sys.argv[2], int(sys.argv[3]))
    elif keras.backend.backend() == "jax":
        against_xla()
    else:
        against_tensorflow()
