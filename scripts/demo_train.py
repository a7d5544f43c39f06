"""A small data-parallel Keras 3 job with kfast: FastLoader shards the data per rank, DistributedOptimizer
averages gradients, the standard callbacks broadcast the start state, warm up the learning rate, average
the metrics and checkpoint on rank 0. Rank 0 finally checks that every rank holds the same weights."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import kfast
from kfast import distributed


def main(checkpoint_dir):
    distributed.init()
    rank, size = distributed.rank(), distributed.size()
    # A learnable task: y = x @ w_true, 32 batches of 32 samples; each rank loads its own shard.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32")
    loader = kfast.data.FastLoader(kfast.data.ArrayDataset(x, y, batch_size=32), workers=1)

    keras.utils.set_random_seed(rank)  # different initial weights per rank, made equal by BroadcastState
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.02)), "mse", jit_compile=False)
    if distributed.is_chief():
        print(f"training on {size} rank(s), {len(loader)} batches per rank per epoch", flush=True)
    model.fit(loader, epochs=5, verbose=2 if distributed.is_chief() else 0,
              callbacks=distributed.callbacks(checkpoint_dir, warmup_epochs=2, monitor="loss"))
    loader.close()

    checksum = float(sum(np.sum(w, dtype="float64") for w in model.get_weights()))
    checksums = distributed.allgather_object(checksum)
    if distributed.is_chief():
        same = len(set(checksums)) == 1
        print(f"weight checksums per rank {checksums}: {'identical' if same else 'DIFFERENT'}", flush=True)
        print(f"checkpoints in {checkpoint_dir}: {sorted(os.listdir(checkpoint_dir))}", flush=True)
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "out/demo-ckpt"))
