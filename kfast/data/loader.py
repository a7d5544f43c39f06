"""FastLoader: a PyDataset that loads batches in parallel worker processes or threads."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any
from typing import cast

import keras
import numpy as np
import psutil

from kfast._core.checks import check_int, check_number
from kfast._core.cpus import usable_cpus
from kfast.distributed import _horovod as distributed
from kfast.data._workers import interrupt
from kfast.data._workers import pool
from kfast.data._workers import signals
from kfast.data._workers import threads
from kfast.data import position
from kfast.data import structure
from kfast.data._keras_order import keras_shuffles
from kfast.data._loader_order import LoaderOrder
from kfast.data._workers.pool import WorkerError
from kfast.data.settings import LoaderSettings
from kfast.data.position import EpochOrder
from kfast.data.sharding import ShardedDataset

__all__ = ["FastLoader", "WorkerError"]


_MAX_TASKS_PER_WORKER = 128
_ENDING_WAIT_S = 30.0  # a wait whose pool the process's end closed: the end comes first (os._exit)


def default_workers() -> int:
    """One worker per usable CPU core (at most 16)."""
    return max(1, min(16, usable_cpus()))


def _length(dataset: Any) -> int:
    """Batches per epoch: `len(dataset)`, or a Keras PyDataset's finite `num_batches`."""
    if hasattr(dataset, "__len__"):
        return len(dataset)
    n = getattr(dataset, "num_batches", None)
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    raise TypeError(
        f"FastLoader needs to know how many batches {type(dataset).__name__} has per epoch: give it __len__ "
        f"(or a PyDataset's num_batches property returning an int); got num_batches={n!r}. Infinite datasets "
        "are not supported.")


def _capped_workers(workers: int | None) -> int | None:
    most = 4 * usable_cpus()
    if workers is not None and not isinstance(workers, bool) and isinstance(workers, int) and workers > most:
        warnings.warn(f"FastLoader got workers={workers}, more than 4 per usable CPU core ({usable_cpus()} cores); "
                      f"using {most}. More workers than that only compete for the same cores.", stacklevel=3)
        return most
    return workers


def _overrides(dataset: Any, method: str) -> bool:
    if isinstance(dataset, ShardedDataset):
        dataset = dataset.dataset
    own = getattr(type(dataset), method, None)
    return own is not None and own is not getattr(keras.utils.PyDataset, method, None)


class FastLoader(keras.utils.PyDataset):
    """Loads a dataset's batches in parallel, ahead of training, without pickling numeric batches.

    Wrap any dataset with `__len__` and `__getitem__(index) -> batch` (a `keras.utils.PyDataset`, a
    Keras `Sequence`, or a plain class). Worker processes start once and live across epochs; numeric
    numpy batches come back through a ring of shared-memory slots, anything else is pickled. Use
    processes (the default) when `__getitem__` runs Python code that holds the GIL, threads
    (`use_multiprocessing=False`) when it mostly runs numpy or I/O that releases it.

    A dataset may also define `fill_batch(index, out)` to skip a copy: `out` has batch 0's structure, its
    leaves empty arrays of batch 0's shapes and dtypes (in worker processes, views of the shared-memory
    slot the batch travels in), and `fill_batch` writes batch `index` into them, returning `None`, or the
    number of leading samples it wrote when the batch is short. `kfast.data.ArrayDataset` does this.

    Worker processes import the dataset's module; when that imports Keras (so TensorFlow: seconds per
    start) but the batches need only numpy, the dataset may define `worker_dataset()`, returning a
    lighter object from a keras-free module that serves the same batches (same `__len__`, `__getitem__`,
    and `fill_batch`/`set_epoch` where the dataset has them). Workers then load that object instead, and
    the fork server imports its module. Epoch hooks still run on the dataset, which is asked again for its
    worker form after each. `ArrayDataset` defines it, and `ShardedDataset` shards the wrapped one's.

    Under Horovod (after `kfast.distributed.init()`), each rank loads only its own shard of the batches,
    the same number on every rank (`kfast.data.shard`, mode "drop"); shard yourself to choose "pad".

    A worker's exception is raised here with the batch index and the worker's traceback. With `timeout`,
    a batch that takes longer raises an error naming the batch index, the worker's pid and its current
    Python stack; without it, a warning with the same facts comes after a minute of waiting, and again
    each minute. Ctrl-C interrupts a wait within a fraction of a second, even inside `fit`.

    Worker processes seed `random` and numpy's global generator before each batch from (seed, epoch,
    batch index): the same seed makes the same random draws for a batch whichever worker loads it, how
    many workers there are, and after a restart, and no two batches repeat each other's draws. The
    dataset may be defined anywhere, a notebook cell or the script itself included: a class that cannot
    be imported by name travels by value (cloudpickle). Batches travel through `/dev/shm`; when it is too
    small for the ring of batches (Docker's default is 64 MB) the ring shrinks, or batches are pickled,
    with a warning that says how to make room.

    Order: with `shuffle=None` (the default) the loader orders batches as Keras would order a PyDataset's:
    inside `model.fit(shuffle=True)` (Keras's default) each epoch is a new permutation fixed by `seed`; in
    `fit(shuffle=False)`, `evaluate`, `predict` and a plain `for` loop, index order. `shuffle=True` or
    `False` fixes the choice everywhere. Either way every index comes exactly once per epoch.
    Each `fit`/`evaluate`/`predict` epoch starts at an epoch boundary of the loader, whatever was consumed
    before (say, by `kfast.diagnose`). The loader calls the dataset's `on_epoch_begin()` and
    `on_epoch_end()` in order (and sends the updated dataset to the workers), or `set_epoch(epoch)` in
    every worker when the dataset defines it (cheaper: nothing is re-sent). Memory in flight is bounded
    by `max_queue_size` batches.

    Resuming: a checkpoint of `kfast.callbacks.RankZeroCheckpoint` records where the loader stood (its
    seed, its epoch, the batches trained; `epoch_order`), and after `kfast.distributed.restore` the first
    FastLoader over a dataset of the same length goes on from there, at its first use: the epoch in progress
    has only its remaining batches (`len()` says so inside it), in the order it would have had, and the
    next epochs follow in theirs (see `kfast.data.position`).

    Keras's own `workers`, `use_multiprocessing` and `max_queue_size` attributes of this PyDataset stay at
    1, False and 1, since Keras would otherwise run the loader inside a pool of its own; the real settings
    are in `settings`.

    Args:
        dataset: the dataset to load from.
        workers: number of workers. Defaults to `None`: one per usable CPU core.
        use_multiprocessing: processes (True) or threads (False). Defaults to `True`.
        max_queue_size: batches loaded ahead of the training loop. Defaults to `None`: twice the
            workers, at least 4.
        shuffle: a new batch order every epoch (`True`), index order (`False`), or as the Keras call
            consuming the loader says (`None`: `fit`'s `shuffle` argument). Defaults to `None`.
        seed: seed of that order and of the workers' random generators, an int >= 0. Defaults to `None`
            (random).
        timeout: seconds to wait for one batch before raising `WorkerError`. Defaults to `None` (wait,
            warning every minute).

    Raises:
        TypeError: when `dataset` lacks `__len__`/`__getitem__` or cannot be sent to processes.
        ValueError: for out-of-range arguments or an empty dataset.

    Example:

    >>> import numpy as np, kfast
    >>> data = kfast.data.ArrayDataset(np.arange(12.0).reshape(6, 2), np.arange(6), batch_size=2)
    >>> with kfast.data.FastLoader(data, workers=2, use_multiprocessing=False) as loader:
    ...     [y.tolist() for x, y in loader]
    [[0, 1], [2, 3], [4, 5]]
    """

    def __init__(self, dataset: Any, *, workers: int | None = None, use_multiprocessing: bool = True,
                 max_queue_size: int | None = None, shuffle: bool | None = None, seed: int | None = None,
                 timeout: float | None = None) -> None:
        # Keras must see a plain single-worker PyDataset, or it would wrap this loader in its own pool;
        # hence kfast's own settings live under other attribute names than PyDataset's.
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=1)
        if not (hasattr(dataset, "__getitem__") and (hasattr(dataset, "__len__") or hasattr(dataset, "num_batches"))):
            from kfast._core import tf_datasets  # needed on this error path only

            if tf_datasets.is_tf_dataset(dataset):
                raise TypeError(tf_datasets.fastloader_refusal(dataset))
            raise TypeError(
                f"FastLoader needs a dataset with __len__ and __getitem__(index) -> batch (a "
                f"keras.utils.PyDataset, a Keras Sequence or your own class); got {type(dataset).__name__}. "
                "For in-memory arrays use kfast.data.ArrayDataset(x, y, batch_size=...).")
        check_int("FastLoader", "workers", workers, or_none="to pick one per CPU core")
        check_int("FastLoader", "max_queue_size", max_queue_size, or_none="for twice the workers")
        if not isinstance(use_multiprocessing, bool):
            raise ValueError(f"FastLoader got use_multiprocessing={use_multiprocessing!r}; pass True or False.")
        check_int("FastLoader", "seed", seed, least=0, or_none="for a random seed")
        check_number("FastLoader", "timeout", timeout, above=0, unit="seconds",
                     or_none="to wait (with a warning every minute)")
        workers = _capped_workers(workers)
        self.dataset = dataset
        total = _length(dataset)
        if total < 1:
            raise ValueError(f"FastLoader got a dataset of length {total}; it needs at least one batch.")
        if shuffle is not None and not isinstance(shuffle, bool):
            raise ValueError(f"FastLoader got shuffle={shuffle!r}; pass True, False, or None to follow fit(shuffle=...).")
        self.shuffle = shuffle
        # Under Horovod each rank serves its own shard (see kfast.data.position for why not a ShardedDataset).
        sharded = distributed.is_initialized() and distributed.size() > 1
        self._order = LoaderOrder(dataset, total, distributed.rank() if sharded else 0,
                                  distributed.size() if sharded else 1,
                                  secrets.randbits(63) if seed is None else int(seed), seed is not None)
        self._order.shuffling = bool(shuffle)
        self._n = self._order.n
        self._hold = False  # a position taken from a checkpoint, kept by the next epoch's start
        self._epoch_start = 0  # where the current (or last) epoch of the loader began
        self._epoch_len = self._n
        self._quiet: Any = None  # the warnings filter of a resumed epoch
        self.timeout = timeout
        self._interrupt_mark = time.monotonic()
        self._interrupted = False
        interrupt.install()
        signals.watch(self)
        self._num_workers = workers or default_workers()
        self._processes = use_multiprocessing
        self._queue_size = max_queue_size
        self._pool: Any = None
        self._signature: Any = None
        self._lookups = 0  # one-off tasks for __getitem__ outside an epoch; their seq numbers are negative
        self._armed = False
        self._first: tuple[int, Any, int] | None = None  # (position, batch, samples) of an epoch's first batch, until its second is taken
        self._replay: tuple[int, Any, int] | None = None
        self._dispatched = self._consumed = 0
        self._dataset_epoch = 0
        self._lock = threading.RLock()
        self.wait_seconds = 0.0  # time callers spent blocked waiting for a batch (ThroughputMonitor reads it)
        self.samples_served = 0

    # -- settings ---------------------------------------------------------------------------------------

    @property
    def settings(self) -> LoaderSettings:
        """The loader's `workers`, `use_multiprocessing` and `max_queue_size` now in force."""
        return LoaderSettings(self._num_workers, self._processes, self._window)

    @property
    def _in_flight(self) -> int:
        # Tasks wait in each worker's pipe: past a few hundred, the pipe fills while the worker blocks
        # sending a batch back, and both sides wait for ever. Deeper queues buy nothing more anyway.
        return min(self._window, _MAX_TASKS_PER_WORKER * self._num_workers)

    @property
    def _window(self) -> int:
        return self._queue_size or max(4, 2 * self._num_workers)

    def configure(self, *, workers: int | None = None, use_multiprocessing: bool | None = None,
                  max_queue_size: int | None = None) -> None:
        """Changes settings; the workers restart on the next batch. Arguments left `None` stay as they are."""
        check_int("FastLoader.configure", "workers", workers, or_none="to keep the current number")
        check_int("FastLoader.configure", "max_queue_size", max_queue_size, or_none="to keep the current depth")
        workers = _capped_workers(workers)
        self.close()
        self._num_workers = workers or self._num_workers
        self._processes = self._processes if use_multiprocessing is None else use_multiprocessing
        self._queue_size = max_queue_size or self._queue_size

    # -- order ----------------------------------------------------------------------------------------

    @property
    def seed(self) -> int:
        """The seed of the batch order and of the workers' random generators."""
        return self._order.seed

    def _index(self, epoch: int, at: int) -> int:
        return self._order.index(epoch, at)

    def _set_order(self, shuffled: bool) -> None:
        """Orders the epoch about to start; batches already loaded ahead for it in the other order are dropped."""
        if shuffled != self._order.shuffling:
            self._order.shuffling = shuffled
            if self._dispatched > self._consumed:
                self.close()

    def _take_offer(self) -> None:
        """Goes on from the position a checkpoint recorded, when `restore()` offered this loader one."""
        with self._lock:
            at = self._order.take_offer()
            if at is None:
                return
            self.close()  # anything loaded ahead belongs to the order before
            position.took(self)
            self._dispatched = self._consumed = at
            epoch = at // self._n
            self._dataset_epoch = epoch
            if not self._processes and hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(epoch)  # process workers set it from each task's epoch
            self._hold, self._first, self._replay = True, None, None
            self._epoch_start, self._epoch_len = at, self._n - at % self._n
            if at % self._n and self._quiet is None:
                # Keras warns "Your input ran out of data" when an epoch has fewer batches than the first
                # said; a resumed epoch has, by design. Only that one message, and only until it ends.
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                self._quiet = warnings.filters[0]

    def epoch_order(self, trained: int, finished: bool = False) -> EpochOrder:
        """This rank's order of the epoch under way, `trained` batches into it (what a checkpoint records);
        with `finished`, the order the next epoch starts with."""
        return self._order.view(self._epoch_start // self._n, trained, finished)

    @property
    def epoch_offset(self) -> int:
        """Batches of the loader's current epoch trained before it began here (after a resume; else 0)."""
        return self._epoch_start % self._n

    # -- the stream of batches ------------------------------------------------------------------------

    def _start(self) -> None:
        # No batch is loaded here: the workers load every one, the first too, so a __getitem__ that
        # crashes, exits or hangs does so in a worker, under `timeout=`, after the worker's own set-up.
        if self._processes:
            # Two slots more than the queue: the batches just handed out are usually still in use. The
            # slots are made for the first batch that comes back, and made larger for a larger one.
            self._pool = pool.ProcessPool(self.dataset, self._num_workers, self._in_flight + 2,
                                           type(self.dataset).__name__, seed=self.seed, timeout=self.timeout)
        else:
            self._pool = threads.ThreadPool(self.dataset, self._num_workers, timeout=self.timeout)

    def _first_seen(self, batch: Any, flat: tuple[Any, list[Any]]) -> None:
        """What the first batch to come back tells: the structure every batch must keep, and its size."""
        self._signature = structure.signature(batch, flat)
        _, nbytes = structure.shm_layout(flat[1])
        self._check_memory(nbytes or sum(np.asarray(leaf).nbytes for leaf in flat[1]))

    def _check_memory(self, batch_bytes: int) -> None:
        need = (self._window + 2) * batch_bytes
        available = psutil.virtual_memory().available
        if need > available // 2:
            raise ValueError(
                f"FastLoader got max_queue_size={self._window}: {self._window + 2} batches of "
                f"{batch_bytes / 2**20:.1f} MiB in flight need {need / 2**30:.2f} GiB, more than half the "
                f"{available / 2**30:.1f} GiB of memory available. Lower max_queue_size (the default, twice "
                "the workers, is usually enough).")

    def _boundary_needs_drain(self) -> bool:
        # Processes hold their own copies: set_epoch runs in each, in task order, with no pause.
        # Threads share one dataset, and on_epoch_end changes the parent's copy: finish the epoch first.
        return _overrides(self.dataset, "on_epoch_end") or (
            not self._processes and hasattr(self.dataset, "set_epoch"))

    def _cross_epoch(self, epoch: int) -> None:
        if _overrides(self.dataset, "on_epoch_end"):
            self.dataset.on_epoch_end()
            if self._processes:
                self._pool.update_dataset(self.dataset)
        if not self._processes and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        self._dataset_epoch = epoch

    def _fill(self) -> None:
        while self._dispatched - self._consumed < self._in_flight:
            epoch, position = divmod(self._dispatched, self._n)
            if epoch > self._dataset_epoch:
                if self._boundary_needs_drain() and self._dispatched != self._consumed:
                    return
                self._cross_epoch(epoch)
            self._pool.submit(self._dispatched, self._index(epoch, position), epoch)
            self._dispatched += 1

    def _next(self) -> Any:
        with self._lock:
            return self._next_locked()

    def _next_locked(self) -> Any:
        if self._interrupted:
            # Once interrupted, every further request fails at once: nothing restarts workers while the
            # process unwinds (a framework thread may still ask for the next batch).
            raise KeyboardInterrupt("FastLoader was interrupted by Ctrl-C")
        seq = self._consumed
        start = time.perf_counter()
        with self._failures_close():
            if self._pool is None:
                self._start()
            self._fill()
            # Ctrl-C since the last batch counts, not only during this wait: the main thread's own
            # KeyboardInterrupt can be lost (raised inside a finalizer, which Python ignores).
            batch = self._pool.result(seq, self._interrupt_mark)
            self.wait_seconds += time.perf_counter() - start
            self._interrupt_mark = time.monotonic()
            self._consumed += 1
            try:
                self._fill()
            except BaseException:
                self._consumed -= 1  # a worker died since: this batch comes again when the loader restarts
                raise
        flat = structure.flatten(batch)
        got = structure.signature(batch, flat)
        if self._signature is None:
            self._first_seen(batch, flat)
        elif got != self._signature:
            self.close()
            raise TypeError(
                f"Batch index {self._index(*divmod(seq, self._n))} of {type(self.dataset).__name__} has "
                f"{structure.describe(got)}, but the first batch had {structure.describe(self._signature)}. "
                "Every batch must have the same nesting, dtypes and ranks.")
        leaves = flat[1]
        samples = structure.samples(leaves)
        self.samples_served += samples
        self._first = (seq, batch, samples) if self._armed and seq == self._epoch_start else None
        return batch

    # -- PyDataset / iteration ------------------------------------------------------------------------

    def __len__(self) -> int:
        # Inside an epoch resumed from a checkpoint, Keras reads the length to know how many batches remain.
        return self._epoch_len if self._armed else self._n

    def __getitem__(self, index: int) -> Any:
        if not -self._n <= index < self._n:
            raise IndexError(f"FastLoader index {index} is out of range for {self._n} batches.")
        if self._armed:
            if self._replay is not None:
                (_, batch, samples), self._replay = self._replay, None
                self.samples_served += samples
                return batch
            return self._next()
        # Outside an epoch (Keras probing the first batches, or a user's direct look-up): the batch at
        # that position of the current epoch, loaded by a worker as every batch is (a one-off task).
        self._take_offer()
        with self._lock, self._failures_close():
            if self._pool is None:
                self._start()
            self._lookups += 1
            epoch, at = divmod(self._consumed, self._n)
            # A resumed epoch's first batches are its remaining ones: Keras's look must not load trained ones.
            at = min(at + index % self._n, self._n - 1) if self._hold else index % self._n
            self._pool.submit(-self._lookups, self._index(epoch, at), epoch)
            return self._pool.result(-self._lookups, self._interrupt_mark)

    @contextlib.contextmanager
    def _failures_close(self) -> Iterator[None]:
        """A failed pool is not reused: the workers are closed (and start anew on the next batch)."""
        try:
            yield
        except KeyboardInterrupt:
            self._interrupted = True
            self.close()
            raise
        except BaseException:
            if signals.ending():
                # The process is being ended (its loaders closed first): wait for that, within a bound.
                time.sleep(_ENDING_WAIT_S)
            self.close()
            raise

    def on_epoch_begin(self) -> None:
        self._interrupt_mark = time.monotonic()  # a Ctrl-C caught before this epoch is not ours to act on
        self._interrupted = False
        self._take_offer()
        shuffles = keras_shuffles(self)
        if shuffles is not None:
            position.claim(self)
        first, self._first = self._first, None
        if first is not None and first[0] == self._consumed - 1 == self._epoch_start and self._epoch_len > 1:
            # The last epoch ended right after its first batch, as Keras's JAX and PyTorch trainers do to
            # build the model from one batch: this epoch starts with that batch again instead of skipping
            # the rest of its epoch (the dataset's on_epoch_begin already ran for it).
            self._replay, self._armed = first, True
            return
        if self._hold:
            self._hold = False  # the epoch goes on where the checkpoint left it, in its recorded order
        else:
            if self._consumed % self._n:
                # Something consumed part of an epoch outside Keras's loop (diagnose, a partial iteration):
                # Keras's epoch starts a whole one, so no batch is repeated or missing in it.
                self.skip_to_next_epoch()
            self._set_order(self.shuffle if self.shuffle is not None else bool(shuffles))
            self._epoch_len = self._n
        self._epoch_start = self._consumed
        if _overrides(self.dataset, "on_epoch_begin"):
            self.dataset.on_epoch_begin()
            if self._pool is not None and self._processes:
                self._pool.update_dataset(self.dataset)
        self._armed = True

    def on_epoch_end(self) -> None:
        self._armed = False
        self._replay = None
        if self._quiet is not None and self._consumed >= self._epoch_start + self._epoch_len:
            with contextlib.suppress(ValueError):
                cast(list, warnings.filters).remove(self._quiet)
            self._quiet = None

    def __iter__(self) -> Iterator[Any]:
        """Yields one epoch of batches in the loader's order (the rest of it, if one was under way)."""
        self._take_offer()
        if self._consumed % self._n == 0 and not self._hold:
            self._set_order(bool(self.shuffle))
        self._hold = False
        for _ in range(self._n - self._consumed % self._n):
            yield self._next()

    def close(self) -> None:
        """Stops the workers and frees shared memory. The loader restarts them if used again."""
        self._first = self._replay = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._dispatched = self._consumed

    def skip_to_next_epoch(self) -> None:
        """Drops the rest of the current epoch (if one is under way), so the next batch starts an epoch."""
        self.close()
        self._dispatched = self._consumed = -(-self._consumed // self._n) * self._n

    def __enter__(self) -> FastLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_tf_dataset(self) -> Any:
        """Returns a `tf.data.Dataset` of one epoch of this loader's batches, prefetched."""
        from kfast.data.tf_bridge import to_tf_dataset

        return to_tf_dataset(self)
