"""The loop a FastLoader worker process runs.

A worker owns one end of a duplex pipe. It receives `("task", seq, index, epoch, slot)`,
`("dataset", payload)` (a new pickled dataset after the parent ran `on_epoch_end`) or `None` (stop). For each task it sends back one of:
    ("shm", seq, spec, layout)    the batch's arrays were written into shared-memory slot `slot`
    ("pickle", seq, batch)        the batch itself (not plain numeric arrays, too large for a slot, or
                                  slot -1: every slot is still held by batches in use)
    ("error", seq, index, text)   the dataset raised; `text` is the worker's formatted traceback
"""

import os
import pickle
import signal
import traceback

import numpy as np

from kfast.data import structure


def _attach(name):
    from multiprocessing import shared_memory

    # Workers share the parent's resource tracker, so attaching adds no second owner: the parent
    # unlinks the segment on close, and the tracker does if the parent dies.
    return shared_memory.SharedMemory(name=name)


def run(conn, dataset_payload, ring):
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dataset = pickle.loads(dataset_payload)
    shm, slot_bytes = (_attach(ring[0]), ring[1]) if ring else (None, 0)
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
            _, seq, index, task_epoch, slot = message
            try:
                if task_epoch != epoch and hasattr(dataset, "set_epoch"):
                    dataset.set_epoch(task_epoch)
                epoch = task_epoch
                batch = dataset[index]
                spec, leaves = structure.flatten(batch)
                layout, nbytes = structure.shm_layout(leaves) if shm is not None else (None, 0)
                if layout is not None and nbytes <= slot_bytes and slot >= 0:
                    base = slot * slot_bytes
                    for leaf, (dtype, shape, offset) in zip(leaves, layout):
                        dst = np.ndarray(shape, dtype, buffer=shm.buf, offset=base + offset)
                        np.copyto(dst, leaf, casting="no")
                    reply = ("shm", seq, spec, layout)
                else:
                    reply = ("pickle", seq, batch)
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
