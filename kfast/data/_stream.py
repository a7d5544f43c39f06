"""A FastLoader's moving parts shared by its epochs: the worker pool, the tasks in flight, the structure every
batch must keep, and what its callers waited.

Tasks carry sequence numbers that only grow; `result(seq)` waits for one of them. Which tasks an epoch
dispatches, and in what order, is the epoch iterator's business (`kfast.data._epoch`); the stream only
counts what is dispatched and not taken (`outstanding`), so that a new epoch whose tasks are not those
can drop them (`close`): the workers start again on the next task.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil

from kfast.data import structure
from kfast.data._workers import pool
from kfast.data._workers import signals
from kfast.data._workers import threads
from kfast.data.settings import LoaderSettings

_ENDING_WAIT_S = 30.0  # a wait whose pool the process's end closed: the end comes first (os._exit)


class Stream:
    """The pool of one FastLoader, started at its first task and closed by `close()` (restarting on the next).

    Args:
        loader: the FastLoader (its `dataset`, `settings`, `seed` and `timeout` are read when the pool starts).
    """

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._pool: Any = None
        self._next_seq = 0
        self._dispatched: set[int] = set()
        self.generation = 0  # counts closes: tasks of an earlier generation are gone
        self.signature: Any = None
        self.interrupt_mark = time.monotonic()
        self.interrupted = False
        self.wait_seconds = 0.0
        self.samples_served = 0

    @property
    def outstanding(self) -> int:
        """Tasks dispatched and not taken."""
        return len(self._dispatched)

    @property
    def running(self) -> bool:
        """Whether the workers are up."""
        return self._pool is not None

    def _start(self) -> None:
        # No batch is loaded here: the workers load every one, the first too, so a __getitem__ that
        # crashes, exits or hangs does so in a worker, under `timeout=`, after the worker's own set-up.
        loader = self._loader
        settings: LoaderSettings = loader.settings
        if settings.use_multiprocessing:
            # Two slots more than the queue: the batches just handed out are usually still in use. The
            # slots are made for the first batch that comes back, and made larger for a larger one.
            self._pool = pool.ProcessPool(loader.dataset, settings.workers, loader._in_flight + 2,
                                          type(loader.dataset).__name__, seed=loader.seed, timeout=loader.timeout)
        else:
            self._pool = threads.ThreadPool(loader.dataset, settings.workers, timeout=loader.timeout)

    def submit(self, index: int, epoch: int) -> int:
        """Dispatches dataset batch `index` of epoch `epoch`; returns its sequence number."""
        if self.interrupted:
            # Once interrupted, every further request fails at once: nothing restarts workers while the
            # process unwinds (a framework thread may still ask for the next batch).
            raise KeyboardInterrupt("FastLoader was interrupted by Ctrl-C")
        with self.failures_close():
            if self._pool is None:
                self._start()
            seq = self._next_seq
            self._next_seq += 1
            self._pool.submit(seq, index, epoch)
            self._dispatched.add(seq)
            return seq

    def update_dataset(self, dataset: Any) -> None:
        """Sends the changed dataset to running process workers (threads share the object itself)."""
        if self._pool is not None and self._loader.settings.use_multiprocessing:
            self._pool.update_dataset(dataset)

    def result(self, seq: int, describe: Any) -> Any:
        """The batch of task `seq`, checked against the first batch's structure. `describe()` names the batch in
        an error."""
        if self.interrupted:
            raise KeyboardInterrupt("FastLoader was interrupted by Ctrl-C")
        start = time.perf_counter()
        with self.failures_close():
            # Ctrl-C since the last batch counts, not only during this wait: the main thread's own
            # KeyboardInterrupt can be lost (raised inside a finalizer, which Python ignores).
            batch = self._pool.result(seq, self.interrupt_mark)
        self._dispatched.discard(seq)
        self.wait_seconds += time.perf_counter() - start
        skipped = self._pool.take_skipped() if self._pool is not None else []
        add_skipped = getattr(self._loader.dataset, "add_skipped", None)
        if skipped and callable(add_skipped):
            add_skipped(skipped)  # the dataset counts and reports them, and may stop the run past its cap
        self.interrupt_mark = time.monotonic()
        flat = structure.flatten(batch)
        got = structure.signature(batch, flat)
        if self.signature is None:
            self._first_seen(flat, got)
        elif got != self.signature:
            self.close()
            raise TypeError(
                f"Batch index {describe()} of {type(self._loader.dataset).__name__} has {structure.describe(got)}, "
                f"but the first batch had {structure.describe(self.signature)}. Every batch must have the same "
                "nesting, dtypes and ranks.")
        self.samples_served += structure.samples(flat[1])
        return batch

    def _first_seen(self, flat: tuple[Any, list[Any]], signature: Any) -> None:
        """What the first batch to come back tells: the structure every batch must keep, and its size."""
        self.signature = signature
        _, nbytes = structure.shm_layout(flat[1])
        self._check_memory(nbytes or sum(np.asarray(leaf).nbytes for leaf in flat[1]))

    def _check_memory(self, batch_bytes: int) -> None:
        window = self._loader.settings.max_queue_size
        need = (window + 2) * batch_bytes
        available = psutil.virtual_memory().available
        if need > available // 2:
            raise ValueError(
                f"FastLoader got max_queue_size={window}: {window + 2} batches of {batch_bytes / 2**20:.1f} MiB in "
                f"flight need {need / 2**30:.2f} GiB, more than half the {available / 2**30:.1f} GiB of memory "
                "available. Lower max_queue_size (the default, twice the workers, is usually enough).")

    def lookup(self, index: int, epoch: int) -> Any:
        """Dataset batch `index`, loaded by a worker as every batch is (a one-off task)."""
        seq = self.submit(index, epoch)
        return self.result(seq, lambda: index)

    @contextlib.contextmanager
    def failures_close(self) -> Iterator[None]:
        """A failed pool is not reused: the workers are closed (and start anew on the next batch)."""
        try:
            yield
        except KeyboardInterrupt:
            self.interrupted = True
            self.close()
            raise
        except BaseException:
            if signals.ending():
                # The process is being ended (its loaders closed first): wait for that, within a bound.
                time.sleep(_ENDING_WAIT_S)
            self.close()
            raise

    def close(self) -> None:
        """Stops the workers and frees shared memory; the tasks in flight are dropped."""
        self._dispatched.clear()
        self.generation += 1
        if self._pool is not None:
            self._pool.close()
            self._pool = None
