"""Holds a FastLoader with worker processes (so shared memory and the fork server exist), then waits.

    horovodrun -np 2 -H hostA:1,hostB:1 python loader_job.py --fail-rank 1   # rank 1 fails, rank 0 is stopped
    python loader_job.py                                                      # one process, waits for a signal

Each rank prints `rank R loader ready` once its workers served a batch and every rank got that far.
"""

import argparse
import sys
import time

import numpy as np

import kfast
from kfast._core import signal_handling

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--seconds", type=float, default=60)
args = parser.parse_args()

kfast.distributed.init()
rank = kfast.distributed.rank()
data = kfast.data.ArrayDataset(np.arange(256 * 4, dtype="float32").reshape(256, 4), np.zeros(256), batch_size=16)
loader = kfast.data.FastLoader(data, training=True, workers=2)
batches = iter(loader)
x, _ = next(batches)
kfast.distributed.allreduce_mean_values([1.0])  # every rank has its loader
# Said by the process itself, after its loader's clean-ups, when SIGTERM or SIGHUP ends it (SIGKILL says
# nothing): the shell's own "Terminated" line is lost when horovodrun freezes the shell before it prints.
signal_handling.on_termination(lambda: print(f"rank {rank} ends on a stop signal", flush=True))
print(f"rank {rank} loader ready, first batch sum {float(x.sum())}", flush=True)
if rank == args.fail_rank:
    print(f"rank {rank} fails on purpose", flush=True)
    sys.exit(3)
deadline = time.monotonic() + args.seconds
while time.monotonic() < deadline:
    time.sleep(0.05)
print(f"rank {rank} was not stopped", flush=True)
