"""The memory bound of W1's fill: processes writing batches into a shared-memory ring with no loader at all.

Each process does what a FastLoader worker does for `field_loaders.FilledImages` (one `np.add` of a
64x224x224x3 uint8 batch into a slot of a shared-memory segment) in a tight loop, for a few seconds. With
1 and with 2 processes this says how many batches per second the machine's memory lets any loader write,
whatever the cores: a loader can approach it, not pass it.

    python benchmarks/fill_bound.py
"""

import multiprocessing
import time
from multiprocessing import shared_memory

import numpy as np

SHAPE = (64, 224, 224, 3)
NBYTES = int(np.prod(SHAPE))
SLOTS = 6  # a FastLoader ring of 2 workers, queue 4, has 6


def _write(name, worker, seconds, results):
    shm = shared_memory.SharedMemory(name=name)
    base = np.random.default_rng(worker).integers(0, 249, SHAPE, dtype=np.uint8)
    slots = [np.ndarray(SHAPE, np.uint8, buffer=shm.buf, offset=i * NBYTES) for i in range(SLOTS)]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.add(base, np.uint8(n % 7), out=slots[(2 * n + worker) % SLOTS])
        n += 1
    results.put(n / (time.perf_counter() - start))
    del slots
    shm.close()


def batches_per_s(processes, seconds=3.0):
    """Batches/s that `processes` processes write together into one shared-memory ring."""
    ctx = multiprocessing.get_context("forkserver")
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * NBYTES)
    try:
        np.ndarray((SLOTS * NBYTES,), np.uint8, buffer=shm.buf)[:] = 1  # pages in, as FastLoader reserves them
        results = ctx.Queue()
        workers = [ctx.Process(target=_write, args=(shm.name, i, seconds, results)) for i in range(processes)]
        for p in workers:
            p.start()
        rates = [results.get(timeout=seconds + 60) for _ in workers]
        for p in workers:
            p.join(timeout=10)
        return sum(rates)
    finally:
        shm.close()
        shm.unlink()


if __name__ == "__main__":
    for count in (1, 2):
        rate = batches_per_s(count)
        print(f"{count} process(es): {rate:.0f} batch/s = {rate * NBYTES / 1e9:.1f} GB/s written")
