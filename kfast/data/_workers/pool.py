"""FastLoader's worker processes: the pool, which keeps the books of tasks, replies and slots.

Both pools (this one, and the threads in `threads`) take tasks `submit(seq, index, epoch)` and hand back
`result(seq)` in any order the caller asks; the loader decides the order and bounds the tasks in flight.
Here: which worker has which task, which slot each task was lent, the replies, and what a dead worker
was doing. `processes` starts the workers, stops them and reads their stacks; `ring` is the shared memory.

NOTE [Who owns what, and the shutdown order]
- The training process owns the pool: the worker processes, one duplex pipe and one stack pipe per
  worker, and the shared-memory ring (`_ring.Ring`). Workers fork from multiprocessing's fork server, a
  clean interpreter that preloaded `kfast.data._workers.worker` (numpy only) and the module of what the workers
  load (the dataset, or its lighter `worker_dataset()`, see `worker_form`), never from the training process.
- `close()` (also run by a finalizer at exit or when the pool is garbage-collected) runs
  `processes.shutdown`: it sends every worker `Stop`, waits up to a second for all of them together, kills
  those still busy (a stuck `__getitem__`), closes the pipes and unlinks the segment; batches already
  handed out keep their mapping until freed.
- If the training process dies without closing (SIGKILL, or a signal with no handler), every worker's
  lifeline pipe (whose only write end the training process held) reads end-of-file and the worker exits,
  stuck or not; the fork server, whose last user is then gone, exits and removes multiprocessing's
  temporary directory (`janitor`); the resource tracker, whose pipe then closes, unlinks the segments
  the training process registered.
"""

from __future__ import annotations

import selectors
import time
import warnings
import weakref
from typing import Any

from kfast.data import structure
from kfast.data._workers import interrupt
from kfast.data._workers import messages
from kfast.data._workers import processes
from kfast.data._workers import ring as _ring
from kfast.data._workers import signals
from kfast.data._workers import sweep
from kfast.data._workers.worker_form import worker_form

# Seconds without a batch before a warning says which worker is stuck where (again every period after).
_STALL_WARNING_S = 60.0
_POLL_S = 0.25  # how often a wait looks at Ctrl-C, the timeout and the stall warning
_INTERRUPT_GRACE_S = 0.5  # after Ctrl-C, the main thread's own KeyboardInterrupt gets this long first


class WorkerError(RuntimeError):
    """A FastLoader worker failed as a worker: it was killed, exited, could not start, timed out, or raised
    an exception that cannot be sent back. The message names the worker, its pid and the batch index.

    An exception the dataset raises reaches the caller with its own type instead (a `ValueError` stays a
    `ValueError`), with the same facts and the worker's traceback in a note.
    """


def raise_failure(error, facts):
    """Raises the dataset's `error` with `facts` (worker, batch index, the worker's traceback) as a note, as
    PyTorch's DataLoader re-raises a worker's exception with its type; a `WorkerError` when there is none."""
    if error is None:
        raise WorkerError(facts)
    error.add_note(facts)
    raise error


class Waiter:
    """The clock of one wait for a batch: the caller's `timeout`, the stall warning, and Ctrl-C."""

    def __init__(self, timeout, describe, interrupt_mark):
        self.start = self._warned = time.monotonic()
        self.timeout, self.describe, self.interrupt_mark = timeout, describe, interrupt_mark

    def restart(self):
        self.start = self._warned = time.monotonic()

    def check(self):
        now = time.monotonic()
        if interrupt.since(self.interrupt_mark, _INTERRUPT_GRACE_S):
            if interrupt.interactive():
                raise KeyboardInterrupt("FastLoader stopped waiting for a batch: Ctrl-C")
            interrupt.end_process(f"Ctrl-C while the training loop waited {now - self.start:.0f} s for a batch "
                                   "from a FastLoader worker; FastLoader closed its workers and ended the process.")
        signum = interrupt.terminated(_INTERRUPT_GRACE_S)
        if signum is not None:
            signals.end_by(signum, f"received while the training loop waited {now - self.start:.0f} s for a batch "
                                   "from a FastLoader worker; FastLoader closed its workers and ended the process.")
        if self.timeout is not None and now - self.start > self.timeout:
            raise WorkerError(f"FastLoader timed out after {self.timeout:g} s (timeout=) waiting for "
                              f"{self.describe()}")
        if now - self._warned > _STALL_WARNING_S:
            self._warned = now
            warnings.warn(f"FastLoader has waited {now - self.start:.0f} s for {self.describe()} Pass "
                          "timeout= to FastLoader to make this an error.", stacklevel=4)


class ProcessPool:
    """`workers` processes from the fork server; numeric batches come back in `slots` shared-memory slots.

    The slots are made when the first batch comes back, pickled, saying how many bytes it needs (and made
    anew, larger, when a larger batch comes): the training process never loads a batch itself to learn
    its size, so whatever a `__getitem__` does (crash, exit, hang) happens in a worker."""

    def __init__(self, dataset, workers, slots, name, seed=0, timeout=None):
        dataset = worker_form(dataset)  # what the workers load: the dataset, or its lighter worker_dataset()
        try:
            payload = processes.dumps(dataset)
        except Exception as e:  # noqa: BLE001 - pickling can raise almost anything
            raise TypeError(
                f"FastLoader(use_multiprocessing=True) must send {name} to worker processes, but it cannot be "
                f"pickled ({type(e).__name__}: {e}). Keep open files, locks and sockets out of its state "
                "(open them lazily in __getitem__), or pass use_multiprocessing=False to use threads."
            ) from e
        sweep.sweep()  # what loaders of processes killed with their whole group left behind
        self._slots, self._timeout = slots, timeout
        self._skipped: list[str] = []  # bad records reported with the replies decoded (take_skipped)
        self._state: dict[str, Any] = {"rings": [], "stacks": []}
        self._ring = None
        ring = self._ring_message()
        self._busy: dict[int, tuple[Any, int]] = {}  # seq -> (ring, slot) for tasks in flight that were lent a slot
        ctx = processes.context(dataset)
        self._processes: list[Any] = []
        self._conns: list[Any] = []
        self._stacks: list[Any] = self._state["stacks"]
        lifeline_read, self._state["lifeline"] = ctx.Pipe(duplex=False)
        self._finalizer = weakref.finalize(self, processes.shutdown, self._processes, self._conns, self._state)
        for i in range(workers):
            p, conn, stack_read = processes.start(ctx, i, lifeline_read, payload, ring, seed)
            self._processes.append(p)
            self._conns.append(conn)
            self._stacks.append(stack_read)
        lifeline_read.close()
        # One selector for the pool's life: building one for every wait cost more than the wait itself.
        self._selector = selectors.DefaultSelector()
        self._state["selector"] = self._selector
        for w, p in enumerate(self._processes):
            self._selector.register(self._conns[w], selectors.EVENT_READ, ("reply", w))
            self._selector.register(p.sentinel, selectors.EVENT_READ, ("exit", w))
        self._pending: list[dict[int, int]] = [{} for _ in range(workers)]  # per worker: seq -> index
        self._replies: dict[int, messages.Reply] = {}
        self._started = [False] * workers
        self._tried_bytes = 0  # the largest batch the slots were (re)made for
        self._start_failures: dict[int, str] = {}  # worker -> its traceback, from StartFailed
        self.shm_batches = self.pickled_batches = 0

    def _make_ring(self, slot_bytes):
        """A ring of `self._slots` slots that fits `/dev/shm`, fewer slots when it must, or None."""
        free = _ring.free_bytes()
        slots = min(self._slots, int(free * 0.9) // slot_bytes)
        while slots >= 2:
            try:
                ring = _ring.Ring(slots, slot_bytes)
            except OSError:
                slots //= 2
                continue
            self._state["rings"].append(ring)
            if slots < self._slots:
                _warn_shm(f"holds {slots} of the {self._slots} batch slots FastLoader wanted", slot_bytes)
            return ring
        _warn_shm("cannot hold two batches, so batches travel pickled (slower)", slot_bytes)
        return None

    def _ring_message(self):
        return messages.NewRing(self._ring.name, self._ring.slot_bytes) if self._ring else messages.NewRing(None, 0)

    def _grow(self, nbytes):
        """Replaces the ring by one whose slots hold `nbytes`; the old one lives on for its batches."""
        old, new = self._ring, self._make_ring(-(-nbytes // 4096) * 4096)
        if new is None:
            return  # /dev/shm has no room for it (_make_ring said so): batches this big travel pickled
        self._ring = new
        message = self._ring_message()
        for w in range(len(self._conns)):
            self._send(w, message)
        if old is not None:
            old.unlink()  # tasks in flight still write into it, and handed-out batches keep their mappings

    def submit(self, seq, index, epoch):
        w = min(range(len(self._pending)), key=lambda i: len(self._pending[i]))
        self._pending[w][seq] = index
        slot = self._ring.acquire() if self._ring else -1
        if slot >= 0:
            self._busy[seq] = (self._ring, slot)
        self._send(w, messages.Task(seq, index, epoch, slot))

    def _send(self, w, message):
        try:
            self._conns[w].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self._raise_dead(w)  # killed (SIGKILL, out of memory) since its last reply

    def update_dataset(self, dataset):
        payload = processes.dumps(worker_form(dataset))
        for w in range(len(self._conns)):
            self._send(w, messages.NewDataset(payload))

    def _describe(self, seq):
        for w, pending in enumerate(self._pending):
            if seq in pending:
                pid = self._processes[w].pid
                return (f"batch index {pending[seq]} from worker {w} (pid {pid}); its stack:\n"
                        f"{processes.read_stack(pid, self._stacks[w])}\n")
        return f"batch {seq}."

    def result(self, seq, interrupt_mark):
        """Batch `seq`; gives up on Ctrl-C pressed after monotonic time `interrupt_mark`."""
        waiter = Waiter(self._timeout, lambda: self._describe(seq), interrupt_mark)
        while seq not in self._replies:
            ready = [key.data for key, _ in self._selector.select(_POLL_S)]
            for kind, w in ready:
                if kind == "exit":
                    continue  # handled below, after draining what the worker managed to send
                try:
                    reply = self._conns[w].recv()
                except (EOFError, OSError):
                    self._raise_dead(w)
                self._started[w] = True
                if isinstance(reply, messages.Ready):
                    continue
                if isinstance(reply, messages.StartFailed):
                    self._start_failures[w] = reply.text
                    self._started[w] = False
                    self._raise_dead(w)
                self._pending[w].pop(reply.seq, None)
                self._replies[reply.seq] = reply
            if seq in self._replies:
                break
            for kind, w in ready:
                if kind == "exit":
                    self._raise_dead(w)
            if not all(self._started[w] for w, pending in enumerate(self._pending) if seq in pending):
                waiter.restart()  # still importing the dataset: not the batch's time yet
            waiter.check()
        return self._decode(self._replies.pop(seq))

    def _raise_dead(self, w):
        self._drain(w)  # what it sent before it died says whether it had started
        p = self._processes[w]
        p.join(timeout=1)
        code = p.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        pending = sorted(self._pending[w].values())
        if w in self._start_failures or not self._started[w]:
            # Tasks are queued in its pipe from the start: none of them was being loaded.
            why = self._start_failures.get(w)
            raise WorkerError(
                f"FastLoader worker {w} (pid {p.pid}) failed while starting, before loading any batch"
                + (f"; its traceback:\n{why}" if why else f": it {how}; its output above may say why") +
                "\nOften the dataset's module cannot be imported in a fresh interpreter (run `python -c 'import "
                "<your module>'` to see), or its state cannot be unpickled. Pass use_multiprocessing=False to "
                "use threads instead.")
        where = f" while loading batch index {pending[0]}" if pending else ""
        hint = ("Out of memory is the usual cause of a kill (check `dmesg`); a dataset that calls os._exit or "
                "crashes in native code is another.")
        raise WorkerError(f"FastLoader worker {w} (pid {p.pid}) {how}{where}. {hint}")

    def _drain(self, w):
        conn = self._conns[w]
        try:
            while conn.poll(0):
                reply = conn.recv()
                if isinstance(reply, messages.StartFailed):
                    self._start_failures[w] = reply.text
                    return
                self._started[w] = True
                if not isinstance(reply, messages.Ready):
                    self._pending[w].pop(reply.seq, None)
                    self._replies[reply.seq] = reply
        except (EOFError, OSError):
            pass

    def take_skipped(self):
        """Bad records the workers' dataset left out of the batches returned since the last call."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def _decode(self, reply):
        ring, slot = self._busy.pop(reply.seq, (None, -1))
        self._skipped.extend(getattr(reply, "skipped", ()))
        if isinstance(reply, messages.InSharedMemory):
            self.shm_batches += 1
            return structure.unflatten(reply.spec, ring.export(slot, reply.layout))
        if ring is not None:
            ring.give_back(slot)
        if isinstance(reply, messages.Pickled):
            self.pickled_batches += 1
            if reply.wanted > self._tried_bytes:
                # The first numeric batch, or a bigger one than any before: later ones fit in a slot again.
                self._tried_bytes = reply.wanted
                self._grow(reply.wanted)
            return structure.unflatten(reply.spec, reply.leaves)
        raise_failure(reply.error, f"FastLoader worker {reply.worker} (pid {reply.pid}) failed on batch index "
                                   f"{reply.index}; the worker's traceback:\n{reply.text}")

    def close(self):
        self._finalizer()


_warned_shm: set[tuple[str, int]] = set()


def _warn_shm(what, slot_bytes):
    free = _ring.free_bytes()
    key = (what.split()[0], slot_bytes)
    if key in _warned_shm:
        return
    _warned_shm.add(key)
    warnings.warn(f"{_ring.SHM_DIR} has {free / 2**20:.1f} MiB free and {what} of {slot_bytes / 2**20:.1f} MiB "
                  f"each. Give it more room (Docker: `docker run --shm-size=2g ...`; Kubernetes: an emptyDir with "
                  "medium Memory on /dev/shm), or lower max_queue_size.", stacklevel=5)
