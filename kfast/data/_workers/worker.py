"""The loop a FastLoader worker process runs. It imports numpy and kfast's data structure helpers only.

A worker owns one end of a duplex pipe and speaks the messages of `messages`: it sends `Ready` once it has
unpickled the dataset (`StartFailed`, with the traceback, if it cannot), then answers each `Task` with
`InSharedMemory` (the batch's arrays were written into the task's slot, straight from the dataset when it
has `fill_batch`, see `fill`), `Pickled` (not plain numeric arrays, or no slot free or big enough) or
`Failed` (the dataset raised: the exception itself when it pickles, and its traceback); `NewDataset` and
`NewRing` change what it loads from and writes into, `Stop` ends it. A dataset with `fill_batch` is lent
arrays laid out like batch 0, which the worker loads once itself to learn that layout.

On SIGUSR1 it writes its Python stack to `stack_conn` (faulthandler, which works even while the
dataset's code is stuck), so the loader can say where a slow batch is.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import mmap
import os
import pickle
import random
import signal
import threading
import traceback
from typing import Any

import numpy as np

from kfast.data import structure
from kfast.data._workers import fill
from kfast.data._workers import messages
from kfast.data._workers import ring as _ring


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


def seed_batch(seed, epoch, index):
    """Seeds `random` and numpy's global generator from (loader seed, epoch, batch index) before a batch
    is loaded. PyTorch's DataLoader seeds each worker once and deals batches to workers in turn; FastLoader
    gives a batch to whichever worker is free, so the draws follow the batch instead: the same seed makes
    the same augmentations whichever worker loads a batch, how many there are, and after a restart."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(4)
    np.random.seed(state)
    random.seed(int.from_bytes(state.tobytes(), "little"))


class _Mapping:
    """A worker's view of the ring's segment: mapped by path, unknown to multiprocessing's resource tracker.

    `SharedMemory(name=...)` registers the segment with the tracker again from the worker (Python before
    3.13), and that message can reach the tracker after the loader's own unregister of an old ring: the
    tracker then reports a leaked segment at exit, and tries to unlink a name already gone. The loader
    alone owns the segment, so workers map it without a word to the tracker.
    """

    def __init__(self, fd):
        self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        self.buf = memoryview(self._map)

    def close(self):
        self.buf.release()
        self._map.close()


def _attach(name):
    if name is None:
        return None
    try:
        fd = os.open(os.path.join(_ring.SHM_DIR, name.lstrip("/")), os.O_RDWR)
    except FileNotFoundError:
        # A worker that started late, or read its pipe late: the loader has grown the slots since and
        # unlinked this segment; the newer one's NewRing is queued behind. Its tasks travel pickled.
        return None
    try:
        return _Mapping(fd)
    finally:
        os.close(fd)


def _load(dataset, task, shm, slot_bytes, template):
    """Loads `task`'s batch and returns the reply that carries it (`wanted`: the slot size it needs)."""
    index, slot = task.index, task.slot
    fill_batch = fill.method(dataset) if template is not None else None
    # Batch 0's arrays must fit the slot: the slots were sized by the first batch to come back, which may
    # be the short last one (a shuffled epoch), and writing past a slot would overwrite the next one.
    if fill_batch is not None and shm is not None and slot >= 0 and fill.nbytes(template) <= slot_bytes:
        # Straight into the slot: the batch is written once, where the training process will read it.
        layout, _ = fill.fill(fill_batch, index, template, shm.buf, slot * slot_bytes)
        return messages.InSharedMemory(task.seq, template[0], layout)
    batch = fill.new_batch(fill_batch, template, index) if fill_batch is not None else dataset[index]
    spec, leaves = structure.flatten(batch)
    layout, nbytes = structure.shm_layout(leaves)
    # Pickled as its nesting and leaves: a namedtuple class the worker only has by value (defined in the
    # training script) travels by name, as in shared memory.
    if layout is None:
        return messages.Pickled(task.seq, spec, leaves, 0)
    if shm is None or nbytes > slot_bytes or slot < 0:
        return messages.Pickled(task.seq, spec, leaves, nbytes)
    base = slot * slot_bytes
    for leaf, (dtype, shape, offset) in zip(leaves, layout):
        dst = np.ndarray(shape, dtype, buffer=shm.buf, offset=base + offset)
        np.copyto(dst, leaf, casting="no")
    return messages.InSharedMemory(task.seq, spec, layout)


def _portable(error):
    """`error` when it survives pickling both ways (it then reaches the user with its own type), else None."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - an exception of a class that cannot be rebuilt travels as text
        return None
    return error


def _failed(task, worker_id, error):
    # The traceback is formatted here, where its frames are; the exception travels without them.
    return messages.Failed(task.seq, task.index, traceback.format_exc(), worker_id, os.getpid(), _portable(error))


def run(conn: Any, lifeline: Any, stack_conn: Any, dataset_payload: bytes, ring: messages.NewRing, seed: int,
        worker_id: int) -> None:
    """The worker's main loop; `ring` is the segment to write into first."""
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(lifeline,), name="kfast-lifeline", daemon=True).start()
    faulthandler.register(signal.SIGUSR1, file=stack_conn.fileno(), all_threads=False)
    _reuse_freed_memory()
    try:
        dataset = pickle.loads(dataset_payload)  # may import the dataset's module: seconds, with Keras
        shm, slot_bytes = _attach(ring.name), ring.slot_bytes
    except Exception:  # noqa: BLE001 - the loader raises it, with this traceback
        conn.send(messages.StartFailed(f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"))
        return
    conn.send(messages.Ready())  # a batch's timeout counts from here
    epoch = None
    template, probed = None, False  # fill_batch's template comes from batch 0, loaded here: never in the training process
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if isinstance(message, messages.Stop):
                return
            if isinstance(message, messages.NewDataset):
                dataset = pickle.loads(message.payload)
                continue
            if isinstance(message, messages.NewRing):
                if shm is not None:
                    shm.close()
                shm, slot_bytes = _attach(message.name), message.slot_bytes
                continue
            task = message
            try:
                if task.epoch != epoch and hasattr(dataset, "set_epoch"):
                    dataset.set_epoch(task.epoch)
                epoch = task.epoch
                seed_batch(seed, task.epoch, task.index)
                if not probed:
                    template, probed = fill.template_of(dataset), True
                reply = _load(dataset, task, shm, slot_bytes, template)
                take_skipped = getattr(dataset, "take_skipped", None)
                if callable(take_skipped):
                    skipped = tuple(take_skipped())
                    reply = dataclasses.replace(reply, skipped=skipped) if skipped else reply
            except Exception as e:  # noqa: BLE001 - every dataset error goes back to the parent
                reply = _failed(task, worker_id, e)
            try:
                conn.send(reply)
            except (BrokenPipeError, EOFError, OSError):
                return
            except Exception as e:  # noqa: BLE001 - e.g. an unpicklable batch
                text = f"the batch cannot be sent to the training process:\n{traceback.format_exc()}"
                conn.send(messages.Failed(task.seq, task.index, text, worker_id, os.getpid(), _portable(e)))
    finally:
        if shm is not None:
            shm.close()
