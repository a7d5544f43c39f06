"""Worker pools behind FastLoader: processes with a shared-memory ring, or threads.

Both take tasks `submit(seq, index, epoch)` and hand back `result(seq)` in any order the caller asks;
the loader decides the order and bounds how many tasks are in flight.
"""

import contextlib
import ctypes
import multiprocessing
import pickle
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import connection
from multiprocessing import shared_memory

import numpy as np

from kfast.data import _worker
from kfast.data import structure

# Workers never fork from the training process: forking a parent whose TensorFlow (or JAX) runtime
# already started threads can deadlock the child. They fork from a fork server instead, a fresh
# interpreter that imported the worker loop and the dataset's module once (importing a module that
# imports Keras costs seconds per worker otherwise), and that never runs framework ops.
_START_METHOD = "forkserver"


def _context(dataset):
    ctx = multiprocessing.get_context(_START_METHOD)
    module = type(dataset).__module__
    preload = ["kfast.data._worker"] + ([module] if module not in ("__main__", "builtins") else [])
    # Only the first call before the server starts takes effect; later datasets import in the child.
    ctx.set_forkserver_preload(preload)
    return ctx


@contextlib.contextmanager
def _main_hidden(needed):
    """Starts processes that do not run the training script again.

    multiprocessing makes each child import the parent's `__main__` (so that classes defined there
    unpickle). A script without an `if __name__ == "__main__":` guard then runs again in every worker;
    under horovodrun that means a second `hvd.init()` in the worker, which aborts it. Workers need only
    the dataset's own module, so the script is hidden while they start, unless the dataset lives in it.
    """
    main = sys.modules.get("__main__")
    if needed or main is None:
        yield
        return
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


class WorkerError(RuntimeError):
    """A FastLoader worker failed; the message holds the batch index and the worker's traceback."""


def _shutdown(processes, conns, shm, slots):
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    for p in processes:
        p.join(timeout=2)
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(timeout=2)
    for conn in conns:
        conn.close()
    slots.clear()
    if shm is not None:
        try:
            shm.close()
        except BufferError:
            pass  # batches still in use map the memory; it is unmapped when the last one is freed
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


class _Segment(shared_memory.SharedMemory):
    """A shared-memory segment that batches may outlive: it stays mapped until their last view is freed."""

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass  # batches still use the mapping; the memory goes when the last of them is freed


class ProcessPool:
    """`workers` processes from the fork server; numeric batches come back in `slots` shared-memory slots."""

    def __init__(self, dataset, workers, slots, slot_bytes, name):
        main = sys.modules.get("__main__")
        if type(dataset).__module__ == "__main__" and not hasattr(main, "__file__"):
            raise TypeError(
                f"{name} is defined in an interactive session (a notebook or REPL), which FastLoader's worker "
                "processes cannot import. Move the class into a .py module and import it, or pass "
                "use_multiprocessing=False to use threads.")
        try:
            payload = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - pickling can raise almost anything
            raise TypeError(
                f"FastLoader(use_multiprocessing=True) must send {name} to worker processes, but it cannot be "
                f"pickled ({type(e).__name__}: {e}). Define the class at module level and keep open files or "
                "locks out of its state, or pass use_multiprocessing=False to use threads."
            ) from e
        self._shm = _Segment(create=True, size=slots * slot_bytes) if slot_bytes else None
        ring = (self._shm.name, slot_bytes) if self._shm else None
        # One ctypes object per slot: every array handed out from a slot, and every view of it, keeps a
        # reference to that object, so its reference count says whether anyone still uses the slot.
        self._slots = [(ctypes.c_char * slot_bytes).from_buffer(self._shm.buf, i * slot_bytes)
                       for i in range(slots)] if self._shm else []
        self._busy = {}  # seq -> slot, for tasks in flight
        ctx = _context(dataset)
        self._processes, self._conns = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._conns, self._shm, self._slots)
        for i in range(workers):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_worker.run, args=(child_end, payload, ring), name=f"kfast-loader-{i}",
                            daemon=True)
            with _main_hidden(needed=b"__main__" in payload):
                p.start()
            child_end.close()  # so a dead worker reads as EOF here, not as silence
            self._processes.append(p)
            self._conns.append(parent_end)
        self._pending = [dict() for _ in range(workers)]  # per worker: seq -> index
        self._replies = {}
        self._started = [False] * workers

    def _free_slot(self):
        """A slot with no task in flight and no batch anyone holds, or -1 (the batch then travels pickled)."""
        taken = set(self._busy.values())
        for i in range(len(self._slots)):
            # Two references: the list and getrefcount's argument. Nobody else can then make a new one.
            if i not in taken and sys.getrefcount(self._slots[i]) == 2:
                return i
        return -1

    def submit(self, seq, index, epoch):
        w = min(range(len(self._pending)), key=lambda i: len(self._pending[i]))
        self._pending[w][seq] = index
        slot = self._free_slot()
        if slot >= 0:
            self._busy[seq] = slot
        self._conns[w].send(("task", seq, index, epoch, slot))

    def update_dataset(self, dataset):
        payload = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self._conns:
            conn.send(("dataset", payload))

    def result(self, seq):
        while seq not in self._replies:
            sentinels = {p.sentinel: i for i, p in enumerate(self._processes)}
            ready = connection.wait(self._conns + list(sentinels), timeout=5.0)
            for obj in ready:
                if obj in sentinels:
                    continue  # handled below, after draining what the worker managed to send
                w = self._conns.index(obj)
                try:
                    reply = obj.recv()
                except (EOFError, OSError):
                    self._raise_dead(w)
                self._started[w] = True
                self._pending[w].pop(reply[1], None)
                self._replies[reply[1]] = reply
            if seq in self._replies:
                break
            for obj in ready:
                if obj in sentinels:
                    self._raise_dead(sentinels[obj])
        return self._decode(self._replies.pop(seq))

    def _raise_dead(self, w):
        p = self._processes[w]
        p.join(timeout=1)
        code = p.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        pending = sorted(self._pending[w].values())
        where = f" while loading batch index {pending[0]}" if pending else ""
        hint = ("Out of memory is the usual cause of a kill (check `dmesg`); a dataset that calls os._exit or "
                "crashes in native code is another.")
        if code == 1 and not self._started[w]:
            hint = ("It failed while starting; its traceback is above. Workers start from a clean interpreter that "
                    "imports your script's module: guard the script's entry point with "
                    "`if __name__ == \"__main__\":`, or pass use_multiprocessing=False.")
        raise WorkerError(f"FastLoader worker {w} (pid {p.pid}) {how}{where}. {hint}")

    def _decode(self, reply):
        kind = reply[0]
        slot = self._busy.pop(reply[1], -1)
        if kind == "shm":
            _, seq, spec, layout = reply
            # No copy: the arrays are views of the slot, which stays reserved while any of them lives.
            leaves = [np.frombuffer(self._slots[slot], dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
                      for dtype, shape, offset in layout]
            return structure.unflatten(spec, leaves)
        if kind == "pickle":
            return reply[2]
        _, _, index, text = reply
        raise WorkerError(f"FastLoader worker failed on batch index {index}; its traceback:\n{text}")

    def close(self):
        self._finalizer()


class ThreadPool:
    """`workers` threads sharing the dataset; best when `__getitem__` releases the GIL (numpy, I/O)."""

    def __init__(self, dataset, workers):
        self._dataset = dataset
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="kfast-loader")
        self._futures = {}
        self._finalizer = weakref.finalize(self, self._executor.shutdown, wait=True, cancel_futures=True)

    def submit(self, seq, index, epoch):
        self._futures[seq] = (index, self._executor.submit(self._dataset.__getitem__, index))

    def update_dataset(self, dataset):
        self._dataset = dataset

    def result(self, seq):
        index, future = self._futures.pop(seq)
        try:
            return future.result()
        except Exception as e:  # noqa: BLE001 - re-raised with the batch index, original chained
            raise WorkerError(f"FastLoader worker thread failed on batch index {index}: "
                              f"{type(e).__name__}: {e}") from e

    def close(self):
        self._finalizer()
