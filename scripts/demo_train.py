"""A tiny data-parallel Keras 3 job: each rank trains on its own shard, gradients are averaged with
Horovod allreduce, and rank 0 prints the loss and checks that every rank holds the same weights."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from kfast import distributed

distributed.init()
rank, size = distributed.rank(), distributed.size()

# Learnable task: y = x @ w_true. Each rank sees a different slice of the data.
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = x @ rng.normal(size=(8, 1)).astype("float32")
x, y = x[rank::size], y[rank::size]

keras.utils.set_random_seed(rank)  # different initial weights per rank, fixed by the broadcast below
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.05)
distributed.broadcast_variables(model.variables, root_rank=0)


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    grads = distributed.allreduce_average(tape.gradient(loss, model.trainable_variables))
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return distributed.allreduce_average([loss])[0]


for epoch in range(5):
    for i in range(0, len(x), 32):
        loss = step(x[i:i + 32], y[i:i + 32])
    if distributed.is_chief():
        print(f"epoch {epoch + 1}/5  loss (mean over {size} ranks) {float(loss):.4f}", flush=True)

checksum = float(sum(np.sum(v.numpy(), dtype="float64") for v in model.weights))
checksums = distributed.allgather_object(checksum)
if distributed.is_chief():
    same = len(set(checksums)) == 1
    print(f"weight checksums per rank {checksums}: {'identical' if same else 'DIFFERENT'}", flush=True)
    raise SystemExit(0 if same else 1)
