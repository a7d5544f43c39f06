"""A training job that can be preempted (tests/distributed/test_preemption.py): alone or under horovodrun.

Every batch says which it is (its index rides in the labels' second column, read back by a metric), so the
job logs, per rank, each trained step as "epoch index learning-rate", and each epoch's end as "end epoch
loss". The order is shuffled by fit (FastLoader's default) with a random seed unless --seed is given, and
the learning rate warms up per batch: a resume that loses the seed or the position shows in the log.

    preempt_script.py DIR [--signal-at STEP] [--signal-rank R] [--resume] [--seed S] [--processes]
                          [--stuck-at INDEX --marker FILE] [--hold-at STEP --marker FILE] [--timeout S]
                          [--slow-exit S]
"""

import argparse
import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import kfast
import kfast.callbacks

BATCHES, BATCH, FEATURES, EPOCHS = 10, 4, 3, 3

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--signal-at", type=int, default=-1, help="the step (counted over the run) that sends SIGTERM")
parser.add_argument("--signal-rank", type=int, default=0)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--processes", action="store_true")
parser.add_argument("--packed", default=None,
                    help="read a pack (kfast pack) of samples (x, [target, sample id]) instead: its first sample's id "
                         "names each batch in the log")
parser.add_argument("--stuck-at", type=int, default=-1,
                    help="a batch index whose loading never ends in the second epoch (when training is under way)")
parser.add_argument("--hold-at", type=int, default=-1,
                    help="the step (counted over the run) after which rank 0 writes --marker and waits for MARKER.go, "
                         "once: a test then signals the job from outside (tests/multihost/test_slurm.py)")
parser.add_argument("--marker", default=None)
parser.add_argument("--timeout", type=float, default=20.0)
parser.add_argument("--slow-exit", type=float, default=0.0,
                    help="seconds the clean-ups of rank --signal-rank take at the end, which then writes the time "
                         "they ended to DIR/cleaned-RANK.txt")
args = parser.parse_args()

tf.config.experimental.enable_op_determinism()
kfast.distributed.init()
rank, size = kfast.distributed.rank(), kfast.distributed.size()
keras.utils.set_random_seed(1)
log_path = os.path.join(args.dir, f"log-{rank}.txt")

if args.slow_exit and rank == args.signal_rank:
    from kfast._core import signal_handling

    def _slow_clean_up():
        time.sleep(args.slow_exit)
        with open(os.path.join(args.dir, f"cleaned-{rank}.txt"), "w") as f:
            f.write(repr(time.time()))

    signal_handling.on_termination(_slow_clean_up)


class Indexed(keras.utils.PyDataset):
    """Batch i: features drawn from seed i; labels (target, i)."""

    def __init__(self, stuck_at=-1, marker=None):
        super().__init__()
        self.stuck_at, self.marker, self.epoch = stuck_at, marker, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return BATCHES

    def __getitem__(self, i):
        if i == self.stuck_at and self.epoch == 1:
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(0.05)
        x = np.random.default_rng(i).normal(size=(BATCH, FEATURES)).astype("float32")
        return x, np.stack([x.sum(1), np.full(BATCH, i)], 1).astype("float32")


class BatchIndex(keras.metrics.Metric):
    def __init__(self, name="index", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value = self.add_variable((), initializer="zeros", name="value")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.value.assign(y_true[0, 1])

    def result(self):
        return self.value


def loss(y_true, y_pred):
    return keras.ops.mean((y_true[:, :1] - y_pred) ** 2)


class Record(keras.callbacks.Callback):
    """Logs each trained step and epoch end; sends SIGTERM to this process at the end of step --signal-at."""

    step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with open(log_path, "a") as f:
            f.write(f"{self.epoch} {int(logs['index'])} {float(self.model.optimizer.learning_rate):.8f}\n")
        if Record.step == args.hold_at and rank == 0 and not os.path.exists(args.marker):
            with open(args.marker, "w") as f:
                f.write(str(os.getpid()))
            deadline = time.monotonic() + 120
            while not os.path.exists(args.marker + ".go") and time.monotonic() < deadline:
                time.sleep(0.05)
        if Record.step == args.signal_at and rank == args.signal_rank:
            os.kill(os.getpid(), signal.SIGTERM)  # as if it came during the step just trained
        Record.step += 1

    def on_epoch_end(self, epoch, logs=None):
        with open(log_path, "a") as f:
            f.write(f"end {epoch} {logs['loss']:.6f}\n")


model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss, metrics=[BatchIndex()],
              jit_compile=False)
checkpoints = os.path.join(args.dir, "checkpoints")
dataset = Indexed(args.stuck_at, args.marker) if args.packed is None else \
    kfast.data.PackedDataset(args.packed, batch_size=BATCH, seed=3 if args.resume else 5)  # the resume takes 5 back
with kfast.data.FastLoader(dataset, training=True, workers=2, use_multiprocessing=args.processes,
                           seed=args.seed) as loader:
    # The loader's position is saved in each checkpoint and handed back by restore(), both through loader=.
    initial_epoch = kfast.distributed.restore(model, checkpoints, loader=loader) if args.resume else 0
    callbacks = [Record(), kfast.callbacks.BroadcastState(),
                 kfast.callbacks.LearningRateWarmup(warmup_epochs=2, multiplier=4),
                 kfast.callbacks.MetricAverage(),
                 kfast.callbacks.RankZeroCheckpoint(checkpoints, monitor="loss", keep=2,
                                                    preemption_timeout=args.timeout, loader=loader),
                 # The monitor reads the loader's counters: a resumed, shorter epoch must not trouble it.
                 kfast.callbacks.ThroughputMonitor(loader)]
    model.fit(loader, epochs=EPOCHS, initial_epoch=initial_epoch, verbose=0, callbacks=callbacks)
np.save(os.path.join(args.dir, f"weights-{rank}.npy"), np.concatenate([w.ravel() for w in model.get_weights()]))
print(f"DONE rank {rank} of {size}", flush=True)
sys.exit(0)
