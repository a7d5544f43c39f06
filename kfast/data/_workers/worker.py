"""The loop a FastLoader worker process runs. It imports numpy and kfast's data structure helpers only.

A worker owns one end of a duplex pipe. It receives `("task", seq, index, epoch, slot)`,
`("dataset", payload)` (a new pickled dataset after the parent ran an epoch hook), `("ring", name,
slot_bytes)` (write into this segment from now on; name None: no ring) or `None` (stop). For each task
it sends back one of:
    ("shm", seq, spec, layout)         the batch's arrays were written into shared-memory slot `slot`
                                       (straight from the dataset when it has `fill_batch`, see `_fill`)
    ("pickle", seq, batch, nbytes)     the batch itself: not plain numeric arrays (nbytes 0), or no slot
                                       was free or big enough (nbytes: the slot size it would need)
    ("error", seq, index, text)        the dataset raised; `text` is the worker's formatted traceback
and, once, `("ready", None)` when it has unpickled the dataset and is about to take tasks. It starts
with `template`, batch 0's structure and layout, when the dataset's batches are numeric: a dataset with
`fill_batch` then writes each batch into views of its slot laid out that way.

On SIGUSR1 it writes its Python stack to `stack_conn` (faulthandler, which works even while the
dataset's code is stuck), so the loader can say where a slow batch is.
"""

import faulthandler
import os
import pickle
import random
import signal
import threading
import traceback

import numpy as np

from kfast.data._workers import fill
from kfast.data import structure

def _watch_parent(lifeline):
    # The training process holds the only write end of `lifeline` and never writes: end of file means it
    # is gone, however it died. Exit then, even while the dataset's code is stuck: a worker that lived on
    # would also keep the fork server (and its temporary directory) alive.
    try:
        lifeline.recv()
    except (EOFError, OSError):
        pass
    os._exit(0)


# glibc's malloc tunables (malloc.h): keep freed memory up to this much, serve requests up to 32 MiB from it.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_FREED_BYTES = 256 << 20


def _reuse_freed_memory():
    # A worker's main thread allocates from glibc's main heap, which hands large freed blocks back to the
    # kernel: each batch's arrays then fault in fresh zeroed pages, measured at 1,000 faults and 2.6 ms of a
    # 1 ms numpy batch (W3 in benchmarks/). Keeping what a batch freed for the next one removes that.
    import ctypes  # numpy has loaded it already

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc: its own allocator decides
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES)


def seed_worker(seed, worker_id, epoch):
    """Seeds `random` and numpy's global generator from (loader seed, worker id, epoch), as PyTorch's
    DataLoader seeds its workers: each worker, epoch and restart draws its own reproducible stream."""
    state = np.random.SeedSequence([seed, worker_id, epoch]).generate_state(4)
    np.random.seed(state)
    random.seed(int.from_bytes(state.tobytes(), "little"))


def _attach(name):
    from multiprocessing import shared_memory

    if name is None:
        return None
    # Workers share the parent's resource tracker, so attaching adds no second owner: the parent
    # unlinks the segment on close, and the tracker does if the parent dies.
    return shared_memory.SharedMemory(name=name)


def _load(dataset, index, shm, slot, slot_bytes, template):
    fill_batch = fill.method(dataset) if template is not None else None
    if fill_batch is not None and shm is not None and slot >= 0:
        # Straight into the slot: the batch is written once, where the training process will read it.
        layout, _ = fill.fill(fill_batch, index, template, shm.buf, slot * slot_bytes)
        return ("shm", None, template[0], layout)
    batch = fill.new_batch(fill_batch, template, index) if fill_batch is not None else dataset[index]
    spec, leaves = structure.flatten(batch)
    layout, nbytes = structure.shm_layout(leaves)
    if layout is None or shm is None:
        return ("pickle", None, batch, 0)
    if nbytes > slot_bytes or slot < 0:
        return ("pickle", None, batch, nbytes)
    base = slot * slot_bytes
    for leaf, (dtype, shape, offset) in zip(leaves, layout):
        dst = np.ndarray(shape, dtype, buffer=shm.buf, offset=base + offset)
        np.copyto(dst, leaf, casting="no")
    return ("shm", None, spec, layout)


def run(conn, lifeline, stack_conn, dataset_payload, ring, seed, worker_id, template=None):
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(lifeline,), name="kfast-lifeline", daemon=True).start()
    faulthandler.register(signal.SIGUSR1, file=stack_conn.fileno(), all_threads=False)
    _reuse_freed_memory()
    dataset = pickle.loads(dataset_payload)  # may import the dataset's module: seconds, with Keras
    shm, slot_bytes = _attach(ring[0]), ring[1]
    conn.send(("ready", None))  # a batch's timeout counts from here
    epoch = None
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if message is None:
                return
            kind = message[0]
            if kind == "dataset":
                dataset = pickle.loads(message[1])
                continue
            if kind == "ring":
                if shm is not None:
                    shm.close()
                shm, slot_bytes = _attach(message[1]), message[2]
                continue
            _, seq, index, task_epoch, slot = message
            try:
                if task_epoch != epoch:
                    seed_worker(seed, worker_id, task_epoch)
                    if hasattr(dataset, "set_epoch"):
                        dataset.set_epoch(task_epoch)
                epoch = task_epoch
                reply = _load(dataset, index, shm, slot, slot_bytes, template)
                reply = (reply[0], seq) + reply[2:]
            except Exception:  # noqa: BLE001 - every dataset error goes back to the parent
                reply = ("error", seq, index, f"worker pid {os.getpid()}:\n{traceback.format_exc()}")
            try:
                conn.send(reply)
            except (BrokenPipeError, EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - e.g. an unpicklable batch
                conn.send(("error", seq, index, f"worker pid {os.getpid()}: batch cannot be sent to the "
                                                f"parent process:\n{traceback.format_exc()}"))
    finally:
        if shm is not None:
            shm.close()
