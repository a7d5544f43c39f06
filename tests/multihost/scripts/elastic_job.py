"""An elastic kfast job that records what it trains: every batch's (epoch, global index), each fit's
(size, learning rate), and at the end its weights and optimizer state.

    horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script S python elastic_job.py OUT_DIR EPOCHS

Batches carry their identity: column 0 of x is the global batch index, column 1 the epoch. A layer
records them (with the time) as the forward pass runs, so only batches that were really trained are written. The job
stops at the end of the epoch in which rank 0 sees OUT_DIR/finish (or after EPOCHS).
"""

import json
import os
import socket
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import kfast
import kfast.callbacks

OUT, EPOCHS = sys.argv[1], int(sys.argv[2])
BATCH, BATCHES = 4, 48
STEP_S = 0.04  # each batch takes this long to load, so that an epoch lasts long enough to act in
ME = f"{socket.gethostname()}-{os.getpid()}"


def _append(name, line):
    with open(os.path.join(OUT, f"{name}-{ME}.txt"), "a") as f:
        f.write(line + "\n")


class Numbered(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return BATCHES

    def __getitem__(self, index):
        time.sleep(STEP_S)
        x = np.zeros((BATCH, 4), "float32")
        x[:, 0], x[:, 1], x[:, 2] = index, self.epoch, np.arange(BATCH)
        return x, np.ones((BATCH, 1), "float32")


class Record(keras.layers.Layer):
    """Writes the (epoch, index) of each batch it sees in training."""

    def _write(self, x):
        _append("trained", f"{int(x[0, 1])} {int(x[0, 0])} {time.time():.3f}")
        return np.float32(0)

    def call(self, x, training=None):
        if training:
            done = tf.py_function(self._write, [x], tf.float32)
            with tf.control_dependencies([done]):
                return tf.identity(x) * tf.constant([0.0, 0.0, 0.001, 0.0]) + tf.constant([0.0, 0.0, 0.0, 1.0])
        return x * tf.constant([0.0, 0.0, 0.001, 0.0]) + tf.constant([0.0, 0.0, 0.0, 1.0])


class Watch(keras.callbacks.Callback):
    """Logs (size, lr) after each fit's first step, and ends the job when rank 0 sees the finish file."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            lr = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            _append("rates", f"{kfast.distributed.size()} {lr!r}")

    def on_epoch_end(self, epoch, logs=None):
        _append("epochs", f"{epoch} {kfast.distributed.size()}")
        done = os.path.exists(os.path.join(OUT, "finish"))
        if kfast.distributed.broadcast_object(done, root_rank=0):  # every rank decides as rank 0 did
            self.model.stop_training = True


kfast.distributed.init()
keras.utils.set_random_seed(7)
model = keras.Sequential([keras.Input((4,)), Record(), keras.layers.Dense(3, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)), "mse", jit_compile=False)
state = kfast.distributed.elastic_fit(
    model, Numbered(), epochs=EPOCHS, commit_every=3, use_multiprocessing=False, workers=2, verbose=0,
    callbacks=[kfast.callbacks.LearningRateWarmup(warmup_epochs=0), Watch()])
values = [np.asarray(v).tolist() for v in model.weights + model.optimizer.variables]
with open(os.path.join(OUT, f"final-rank{kfast.distributed.rank()}.json"), "w") as f:
    json.dump({"size": kfast.distributed.size(), "epoch": state.epoch, "resets": state.resets, "state": values}, f)
print(f"rank {kfast.distributed.rank()} of {kfast.distributed.size()} finished at epoch {state.epoch}", flush=True)
