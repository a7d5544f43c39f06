"""FastLoader's worker threads: best when `__getitem__` releases the GIL (numpy, decoding, I/O).

Plain daemon threads rather than a ThreadPoolExecutor: the executor's threads are joined at interpreter
exit, so one `__getitem__` that never returns would keep Python from exiting. `close()` waits a moment
for running tasks, then abandons a stuck thread (and says so); a daemon thread does not block exit.
"""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from typing import Any
from concurrent import futures
from concurrent.futures import Future

from kfast.data._workers import fill
from kfast.data._workers.pool import _POLL_S
from kfast.data._workers.pool import Waiter
from kfast.data._workers.pool import WorkerError
from kfast.data._workers.pool import raise_failure

_CLOSE_WAIT_S = 2.0


def _run(tasks, running):
    while True:
        task = tasks.get()
        if task is None:
            return
        future, fn, index = task
        if not future.set_running_or_notify_cancel():
            continue
        running[threading.get_ident()] = index
        try:
            future.set_result(fn(index))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(e)
        finally:
            running.pop(threading.get_ident(), None)


def _stop(tasks, threads):
    # A loader dropped without close(): its threads take one stop each and end, instead of waiting in
    # tasks.get() for the life of the process. (They hold the queue, never the pool, so the pool can go.)
    for _ in threads:
        tasks.put(None)


class ThreadPool:
    """`workers` daemon threads sharing the dataset; a dataset with `fill_batch` writes each batch into
    fresh arrays laid out like batch 0, as it writes into shared memory in worker processes."""

    def __init__(self, dataset, workers, timeout=None):
        self._timeout = timeout
        self._template_lock = threading.Lock()
        self.update_dataset(dataset)
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._running: dict[int, int] = {}  # thread ident -> batch index it is loading
        self._threads = [threading.Thread(target=_run, args=(self._tasks, self._running), daemon=True,
                                          name=f"kfast-loader-{i}") for i in range(workers)]
        for t in self._threads:
            t.start()
        self._finalizer = weakref.finalize(self, _stop, self._tasks, list(self._threads))
        self._futures: dict[int, tuple[int, Future[Any]]] = {}
        self._waited: set[Future[Any]] = set()  # the futures result() is waiting on, taken out of _futures
        self._closed = False

    def submit(self, seq, index, epoch):
        if self._closed:
            # Tasks queued after the threads' stops would never run: a wait for one would never end.
            raise WorkerError(f"FastLoader's worker threads are closed; batch index {index} was asked of them "
                              "afterwards (is the loader used from two threads at once?).")
        future: Future[Any] = Future()
        self._futures[seq] = (index, future)
        self._tasks.put((future, self._load, index))

    def take_skipped(self):
        """Bad records the shared dataset left out since the last call (its `take_skipped()`)."""
        take = getattr(self._dataset, "take_skipped", None)
        return list(take()) if callable(take) else []

    def update_dataset(self, dataset):
        self._dataset, self._template, self._probed = dataset, None, False
        self._load = self._first_load if fill.method(dataset) is not None else dataset.__getitem__

    def _first_load(self, index):
        # fill_batch's layout comes from batch 0, loaded in a worker thread like any batch (under timeout=).
        with self._template_lock:
            if not self._probed:
                self._template, self._probed = fill.template_of(self._dataset), True
                if self._template is not None:
                    self._load = functools.partial(fill.new_batch, fill.method(self._dataset), self._template)
                else:
                    self._load = self._dataset.__getitem__
        return self._load(index)

    def _describe(self, index):
        frames = sys._current_frames()
        for ident, busy in list(self._running.items()):
            if busy == index and ident in frames:
                stack = "".join(traceback.format_stack(frames[ident]))
                return f"batch index {index} from a worker thread; its stack:\n{stack}"
        # No thread has it yet: say what each one is doing, so a stall behind the others can be traced.
        stacks = [f"thread {ident} on batch index {other}:\n{''.join(traceback.format_stack(frames[ident]))}"
                for ident, other in list(self._running.items()) if ident in frames]
        alive = sum(t.is_alive() for t in self._threads)
        return (f"batch index {index} (waiting for a free worker thread; {alive} of {len(self._threads)} alive, "
                f"{len(stacks)} busy)" + (":\n" + "".join(stacks) if stacks else "."))

    def result(self, seq, interrupt_mark):
        index, future = self._futures.pop(seq)
        waiter = Waiter(self._timeout, lambda: self._describe(index), interrupt_mark)
        self._waited.add(future)
        try:
            return self._wait(future, index, waiter)
        finally:
            self._waited.discard(future)

    def _wait(self, future, index, waiter):
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except futures.TimeoutError:
                waiter.check()
            except futures.CancelledError:
                raise WorkerError(f"FastLoader's worker threads were closed while batch index {index} waited for "
                                  "one.") from None
            except Exception as e:  # noqa: BLE001 - re-raised with its own type, the batch index noted
                raise_failure(e, f"FastLoader worker thread failed on batch index {index}.")
            except BaseException as e:  # sys.exit() in __getitem__: it ends no process from a worker
                raise WorkerError(f"FastLoader worker thread stopped on batch index {index}: the dataset raised "
                                  f"{type(e).__name__}({e}).") from e

    def close(self):
        self._closed = True
        # A batch being waited for that no thread has started is cancelled too: its wait ends with an error
        # (one a thread is loading finishes, and is served).
        for future in [future for _, future in self._futures.values()] + list(self._waited):
            future.cancel()
        self._futures.clear()
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            warnings.warn(f"FastLoader left {len(stuck)} worker thread(s) still inside the dataset's __getitem__ "
                          f"after {_CLOSE_WAIT_S:g} s ({', '.join(stuck)}); they are abandoned and will not "
                          "delay exit.", stacklevel=3)
        self._threads = []
        self._finalizer.detach()  # the stops are queued already
