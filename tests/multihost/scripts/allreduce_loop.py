"""Allreduces until stopped, at most SECONDS: a job to kill or cut off a host under.

    horovodrun -np 2 -H hostA:1,hostB:1 python allreduce_loop.py SECONDS

Each rank prints `rank R ready` once the first allreduce went through, so every rank is connected.
"""

import sys
import time

import kfast

kfast.distributed.init()
rank = kfast.distributed.rank()
kfast.distributed.allreduce_mean_values([1.0])
print(f"rank {rank} ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    kfast.distributed.allreduce_mean_values([float(rank)])
    time.sleep(0.05)
print(f"rank {rank} ran out of time", flush=True)
