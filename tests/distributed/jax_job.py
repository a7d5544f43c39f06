"""A training job on kfast's JAX engine (tests/distributed/test_jax_engine.py), alone or under `kfast launch`.

Each process writes DIR/weights-RANK.npy (its copy of every weight, flattened), DIR/log-RANK.txt (one line per
trained step: "epoch batch learning-rate") and DIR/writes-RANK.txt (every file it opened for writing
under DIR/checkpoints, seen by an audit hook). The job's data are 96 samples whose labels carry their ids.

    jax_job.py DIR --batch B [--epochs E] [--shuffle] [--model-parallel] [--signal-at STEP --signal-rank R]
                   [--resume] [--lr LR] [--warmup-epochs N] [--hold-at STEP --marker PATH]
"""

import argparse
import json
import os
import signal
import sys
import time

import keras
import numpy as np

import kfast
from kfast.planning import propose_layout_map

SAMPLES, FEATURES = 96, 6

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--batch", type=int, required=True, help="samples per process and step")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--shuffle", action="store_true")
parser.add_argument("--model-parallel", action="store_true", help="kernels split over a (2, 4) mesh's model axis")
parser.add_argument("--signal-at", type=int, default=-1, help="the step (over the run) after which SIGTERM comes")
parser.add_argument("--signal-rank", type=int, default=0)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--hold-at", type=int, default=-1,
                    help="rank 0 makes --marker after this step and waits for MARKER.go (once: not if the marker exists)")
parser.add_argument("--marker")
parser.add_argument("--lr", type=float, default=0.02, help="one process's rate; default_callbacks scales it by size")
parser.add_argument("--warmup-epochs", type=int, default=1)
parser.add_argument("--packed", action="store_true",
                    help="read the samples from a pack (kfast pack) with a permutation seeded 5, or 3 with --resume: "
                         "the checkpoint must put 5 back")
args = parser.parse_args()

kfast.distributed.init()
os.makedirs(args.dir, exist_ok=True)  # on hosts that share no disk, each process makes its own
rank, size = kfast.distributed.rank(), kfast.distributed.size()
checkpoints = os.path.join(args.dir, "checkpoints")
writes = []


def audit(event, details):
    if event == "open" and isinstance(details[0], str) and details[0].startswith(checkpoints) \
            and (any(c in str(details[1]) for c in "wax+") or (details[2] or 0) & (os.O_WRONLY | os.O_RDWR)):
        writes.append(details[0])


sys.addaudithook(audit)
keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
y = np.stack([x @ np.linspace(-1, 1, FEATURES), np.arange(SAMPLES)], 1).astype("float32")


def build():
    inputs = keras.Input((FEATURES,), name="x")
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden), name="net")


if args.model_parallel:
    # A model built first to read its variables' paths; the one trained is built under the layout.
    layout = propose_layout_map(build(), (2, 4))
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="data"))
    keras.utils.set_random_seed(1)


def loss(y_true, y_pred):
    return keras.ops.mean((y_true[:, :1] - y_pred) ** 2)


class Record(keras.callbacks.Callback):
    step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with open(os.path.join(args.dir, f"log-{rank}.txt"), "a") as f:
            f.write(f"{self.epoch} {batch} {float(self.model.optimizer.learning_rate):.8f}\n")
        if Record.step == args.signal_at and rank == args.signal_rank:
            os.kill(os.getpid(), signal.SIGTERM)  # as if it came during the step just trained
        if Record.step == args.hold_at and rank == 0 and not os.path.exists(args.marker):
            open(args.marker, "w").close()  # a test sends its signal now, then lets it go on
            for _ in range(1200):
                if os.path.exists(args.marker + ".go"):
                    break
                time.sleep(0.1)
        Record.step += 1


model = build()
model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9)), loss)
if args.packed:
    # Each process packs into a folder of its own (these hosts may share no disk); the packs are identical.
    packed = kfast.data.pack((x, y), os.path.join(args.dir, f"pack-{rank}"), shard_size=32, verbose=0) \
        if not os.path.exists(os.path.join(args.dir, f"pack-{rank}", "kfast-pack.json")) \
        else os.path.join(args.dir, f"pack-{rank}")
    data = kfast.data.PackedDataset(packed, batch_size=args.batch, seed=3 if args.resume else 5)
else:
    data = kfast.data.ArrayDataset(x, y, batch_size=args.batch)
with kfast.data.FastLoader(data, training=True, workers=1) as loader:
    initial_epoch = kfast.distributed.restore(model, checkpoints, loader=loader) if args.resume else 0
    callbacks = [Record(), *kfast.distributed.default_callbacks(checkpoints, warmup_epochs=args.warmup_epochs, monitor="loss",
                                                                save_freq=4, loader=loader)]
    model.fit(loader, epochs=args.epochs, initial_epoch=initial_epoch, shuffle=args.shuffle, verbose=0,
              callbacks=callbacks)
weights = [np.asarray(v.value.addressable_data(0)) if not args.model_parallel else np.asarray(v.value)
           for v in model.weights]
np.save(os.path.join(args.dir, f"weights-{rank}.npy"), np.concatenate([w.ravel() for w in weights]))
with open(os.path.join(args.dir, f"writes-{rank}.txt"), "w") as f:
    f.write("\n".join(writes))
kernel = model.get_layer("hidden").kernel.value.sharding
with open(os.path.join(args.dir, f"facts-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "devices": len(kernel.device_set),
               "kernel_spec": [a for a in getattr(kernel, "spec", ())],
               "mesh": dict(getattr(getattr(kernel, "mesh", None), "shape", {}))}, f)
print(f"DONE rank {rank} of {size}", flush=True)
