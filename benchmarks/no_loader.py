"""What the machine gives a workload with no loader at all: its batches made in 1 and in 2 processes at once.

A loader can approach these rates, not pass them. `field_bench` prints them beside the loaders, because
"usable cores x the single-core rate" assumes two processes run as fast as one each, which memory
bandwidth and shared caches need not allow:
- `fill_rate`: W1's work as a FastLoader worker does it for `field_loaders.FilledImages`, one `np.add` of a
  64x224x224x3 uint8 batch into a slot of a shared-memory ring.
- `getitem_rate`: any dataset's `__getitem__` (W2's pure Python, W4's JPEG decoding), results dropped.

    python benchmarks/no_loader.py
"""

import multiprocessing
import time
from multiprocessing import shared_memory

import numpy as np

SHAPE = (64, 224, 224, 3)
NBYTES = int(np.prod(SHAPE))
SLOTS = 6  # a FastLoader ring of 2 workers, queue 4, has 6


def _fill(name, worker, seconds, results):
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


def _getitem(dataset, worker, seconds, results):
    n, count = 0, len(dataset)
    dataset[worker % count]  # warm-up: first-touch costs are not the steady rate
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        dataset[(2 * n + worker) % count]
        n += 1
    results.put(n / (time.perf_counter() - start))


def _together(target, args, processes, seconds):
    ctx = multiprocessing.get_context("forkserver")
    results = ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, i, seconds, results)) for i in range(processes)]
    for p in workers:
        p.start()
    rates = [results.get(timeout=seconds + 120) for _ in workers]
    for p in workers:
        p.join(timeout=10)
    return sum(rates)


def fill_rate(processes, seconds=3.0):
    """Batches/s that `processes` processes write together into one shared-memory ring (W1's fill)."""
    shm = shared_memory.SharedMemory(create=True, size=SLOTS * NBYTES)
    try:
        np.ndarray((SLOTS * NBYTES,), np.uint8, buffer=shm.buf)[:] = 1  # pages in, as FastLoader reserves them
        return _together(_fill, (shm.name,), processes, seconds)
    finally:
        shm.close()
        shm.unlink()


def getitem_rate(dataset, processes, seconds=3.0):
    """Batches/s of `dataset[i]` in `processes` processes together, each holding its own copy."""
    return _together(_getitem, (dataset,), processes, seconds)


if __name__ == "__main__":
    for count in (1, 2):
        rate = fill_rate(count)
        print(f"W1 fill, {count} process(es): {rate:.0f} batch/s = {rate * NBYTES / 1e9:.1f} GB/s written")
