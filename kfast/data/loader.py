"""FastLoader: a PyDataset that loads batches in parallel worker processes or threads."""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import keras

from kfast._core.checks import check_int, check_number
from kfast._core import topology
from kfast.data._epoch import Ahead, EpochIterator
from kfast.data._keras_epochs import KerasEpochs
from kfast.data._loader_position import LoaderPosition
from kfast.data._cursor import Cursor
from kfast.data._loader_args import MAX_TASKS_PER_WORKER, capped_workers, default_seed
from kfast.data._loader_args import default_workers, keras_data_shards, length, overrides
from kfast.data._loader_order import LoaderOrder
from kfast.data._stream import Stream
from kfast.data._workers import interrupt
from kfast.data._workers import signals
from kfast.data._workers.pool import WorkerError
from kfast.data.settings import LoaderSettings

__all__ = ["FastLoader", "WorkerError"]


class FastLoader(LoaderPosition, KerasEpochs, keras.utils.PyDataset):
    """Loads a dataset's batches in parallel, ahead of training, without pickling numeric batches.

    Wrap any dataset with `__len__` and `__getitem__(index) -> batch` (a `keras.utils.PyDataset`, a
    Keras `Sequence`, or a plain class). Worker processes start once and live across epochs; numeric
    numpy batches come back through a ring of shared-memory slots, anything else is pickled. Use
    processes (the default) when `__getitem__` runs Python code that holds the GIL, threads
    (`use_multiprocessing=False`) when it mostly runs numpy or I/O that releases it.

    A dataset may define `fill_batch(index, out)`, to write a batch into the shared memory it travels in
    (no copy), and `worker_dataset()`, a lighter object from a keras-free module for the workers to load
    (no TensorFlow start per worker); `kfast.data.ArrayDataset` defines both (the loader guide says how).

    What it reads is its own setting, fixed when it is built, whichever Keras call reads it. The data `fit`
    trains on is built with `training=True`: under Horovod (after `kfast.distributed.init()`) each rank loads
    only its own shard of the batches, the same number on every rank (`kfast.data.shard`, mode "drop"); shard
    yourself to choose "pad", or pass `rank=` and `size=`, as to PyTorch's `DistributedSampler`. Any other
    loader is read whole, in index order, on every rank, so `evaluate`, `predict` and `fit`'s validation give
    one process's results (see the scale-out guide). On the JAX engine, or under a `keras.distribution` of the
    user's own over several processes, each process reads its part of every global batch, for every call.

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

    Order: each `iter(loader)`, and each epoch of `fit`, `evaluate` or `predict`, is a new epoch that starts at
    its first batch, as with Keras's `PyDataset` and PyTorch's `DataLoader`: looking at one batch with
    `next(iter(loader))` leaves the next loop whole (an iteration dropped before its end stops the workers,
    which the next one starts again). With `shuffle=None` (the default) training data is a new
    permutation every epoch, fixed by `seed` and the epoch's number, and any other loader reads in index
    order; `shuffle=True` or `False` fixes the choice. Either way every index comes exactly once per epoch. The
    loader is Keras's data adapter, which Keras passes through as is: `fit(shuffle=...)` and
    `fit(class_weight=...)` do not reach it (as Keras says of a tf.data pipeline); the loader's own `shuffle`
    and `class_weight` govern. The loader calls the dataset's `on_epoch_begin()`
    and `on_epoch_end()` around each epoch (and sends the updated dataset to the workers), or
    `set_epoch(epoch)` in every worker when the dataset defines it (cheaper: nothing is re-sent). Memory in
    flight is bounded by `max_queue_size` batches. `loader[i]` is batch `i` of the loader's shard, in index
    order, whatever the epoch.

    Seeds: without `seed=`, the seed is drawn from Python's `random` module, which
    `keras.utils.set_random_seed(n)` seeds: the same script with the same `n` trains in the same order,
    another `n` in another, and without a global seed each run has its own. Under Horovod each rank draws
    its own (the same on every rank after `set_random_seed`, each permuting its own shard).

    Resuming: `state_dict()` says where the loader stands (its epoch, the batches of it handed out, its seed
    and shard layout) and `load_state_dict(state)` makes the next iteration go on from there: the rest of
    that epoch, in the order it would have had, then the next epochs in theirs. `kfast.callbacks.
    RankZeroCheckpoint(loader=...)` records it in each checkpoint (every rank's) and
    `kfast.distributed.restore(model, directory, loader=...)` loads it, on the same or another number of
    ranks (see `kfast.data.position`).

    Keras's own `workers`, `use_multiprocessing` and `max_queue_size` attributes of this PyDataset stay at
    1, False and 1, since Keras would otherwise run the loader inside a pool of its own; the real settings
    are in `settings`.

    Args:
        dataset: the dataset to load from.
        training: whether `fit` trains on it: shuffled each epoch, and each rank its own shard under data
            parallel. Defaults to `False`: every batch, in index order, on every rank (evaluate, predict,
            validation).
        workers: number of workers. Defaults to `None`: one per usable CPU core.
        use_multiprocessing: processes (True) or threads (False). Defaults to `True`.
        max_queue_size: batches loaded ahead of the training loop. Defaults to `None`: twice the
            workers, at least 4.
        shuffle: a new batch order every epoch (`True`), index order (`False`), or `None`: shuffled when
            `training`. Defaults to `None`.
        seed: seed of that order and of the workers' random generators, an int >= 0. Defaults to `None`:
            drawn from Python's `random`, which `keras.utils.set_random_seed` sets.
        timeout: seconds to wait for one batch before raising `WorkerError`. Defaults to `None` (wait,
            warning every minute).
        rank: this process's rank, for the loader's own sharding. Defaults to `None`: the rank of the job
            (`kfast.distributed.rank()`, 0 in a single process) for training data.
        size: the number of ranks sharing the dataset. Defaults to `None`: the job's
            (`kfast.distributed.size()`) for training data, 1 (the whole set) for any other on Horovod.
        class_weight: `{class index: weight}`, turned into sample weights from each batch's targets, as Keras's
            `fit(class_weight=...)` does for a PyDataset. Defaults to `None`.

    Raises:
        TypeError: when `dataset` lacks `__len__`/`__getitem__` or cannot be sent to processes.
        ValueError: for out-of-range arguments or an empty dataset.

    Example:

    >>> import numpy as np, kfast
    >>> data = kfast.data.ArrayDataset(np.arange(12.0).reshape(6, 2), np.arange(6), batch_size=2)
    >>> with kfast.data.FastLoader(data, workers=2, use_multiprocessing=False) as loader:
    ...     x, y = next(iter(loader))  # a look at one batch leaves the next loop whole
    ...     [y.tolist() for x, y in loader]
    [[0, 1], [2, 3], [4, 5]]
    """

    def __init__(self, dataset: Any, *, training: bool = False, workers: int | None = None,
                 use_multiprocessing: bool = True, max_queue_size: int | None = None, shuffle: bool | None = None,
                 seed: int | None = None, timeout: float | None = None, rank: int | None = None,
                 size: int | None = None, class_weight: dict[int, float] | None = None) -> None:
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
        check_int("FastLoader", "seed", seed, least=0, or_none="for a seed drawn from Python's random")
        check_number("FastLoader", "timeout", timeout, above=0, unit="seconds",
                     or_none="to wait (with a warning every minute)")
        if not isinstance(training, bool):
            raise ValueError(f"FastLoader got training={training!r}; pass True for the data fit trains on, False for "
                             "data to evaluate or predict on.")
        if class_weight is not None and not isinstance(class_weight, dict):
            raise ValueError(f"FastLoader got class_weight={class_weight!r}; pass a dict {{class index: weight}}.")
        # Training data is sharded over the job's ranks; anything else is read whole on every Horovod rank. On the
        # JAX engine one step is one program over every process's part of a global batch, for every call.
        shards = training or topology.one_step_for_all()
        keras_shards = keras_data_shards() if topology.size() == 1 else None
        if keras_shards is not None and size is None and rank is None:
            rank, size = keras_shards  # a user's own keras.distribution over several processes (see its docs)
            shards = True
        size = (topology.size() if shards else 1) if size is None else size
        rank = (topology.rank() if shards and size > 1 else 0) if rank is None else rank
        check_int("FastLoader", "size", size, hint="the number of ranks sharing the dataset")
        check_int("FastLoader", "rank", rank, least=0, hint=f"this process's rank, below size={size}")
        if rank >= size:
            raise ValueError(f"FastLoader got rank={rank} with size={size}; a rank is 0 to size - 1.")
        workers = capped_workers(workers)
        self.dataset = dataset
        total = length(dataset)
        if total < 1:
            raise ValueError(f"FastLoader got a dataset of length {total}; it needs at least one batch.")
        if shuffle is not None and not isinstance(shuffle, bool):
            raise ValueError(f"FastLoader got shuffle={shuffle!r}; pass True, False, or None to follow fit(shuffle=...).")
        if (topology.one_step_for_all() or keras_shards is not None) and size > 1 and not training and total % size:
            raise ValueError(
                f"FastLoader got a dataset of {total} batches to evaluate or predict on over {size} JAX processes; each "
                f"step is one program over all of them, so every process needs as many batches, all full: give it a "
                f"multiple of {size} batches (with batches of B samples, a multiple of {size} x B samples).")
        self.shuffle = shuffle
        self.training = training
        self.class_weight = class_weight
        # Each rank serves its own shard (see kfast.data.position for why not a ShardedDataset).
        self._order = LoaderOrder(dataset, total, rank, size, default_seed() if seed is None else int(seed))
        self.timeout = timeout
        self._num_workers = workers or default_workers()
        self._processes = use_multiprocessing
        self._queue_size = max_queue_size
        self._lock = threading.RLock()
        self._stream = Stream(self)
        self._cursor = Cursor(self._order, self._shuffled(), seed is not None)
        self._current_ref: weakref.ref[EpochIterator] | None = None  # the latest iteration, while someone holds it
        self._ahead: Ahead | None = None
        self._quiet: Any = None  # the warnings filter of a resumed Keras epoch
        self._signature: Any = None  # the tf.data signature of the batches, once asked for
        self._read_token: int | None = None  # while a Keras loop reads this loader (kfast.data._workers.interrupt)
        self._warned_shard = False
        interrupt.install()
        signals.watch(self)

    # -- settings ---------------------------------------------------------------------------------------

    @property
    def settings(self) -> LoaderSettings:
        """The loader's `workers`, `use_multiprocessing` and `max_queue_size` now in force."""
        return LoaderSettings(self._num_workers, self._processes, self._window)

    @property
    def _in_flight(self) -> int:
        # Tasks wait in each worker's pipe: past a few hundred, the pipe fills while the worker blocks
        # sending a batch back, and both sides wait for ever. Deeper queues buy nothing more anyway.
        return min(self._window, MAX_TASKS_PER_WORKER * self._num_workers)

    @property
    def _window(self) -> int:
        return self._queue_size or max(4, 2 * self._num_workers)

    def configure(self, *, workers: int | None = None, use_multiprocessing: bool | None = None,
                  max_queue_size: int | None = None) -> None:
        """Changes settings; the workers restart on the next batch. Arguments left `None` stay as they are."""
        check_int("FastLoader.configure", "workers", workers, or_none="to keep the current number")
        check_int("FastLoader.configure", "max_queue_size", max_queue_size, or_none="to keep the current depth")
        workers = capped_workers(workers)
        self.close()
        self._num_workers = workers or self._num_workers
        self._processes = self._processes if use_multiprocessing is None else use_multiprocessing
        self._queue_size = max_queue_size or self._queue_size

    @property
    def seed(self) -> int:
        """The seed of the batch order and of the workers' random generators."""
        return self._order.seed

    @property
    def wait_seconds(self) -> float:
        """Seconds callers spent blocked waiting for a batch (ThroughputMonitor reads it)."""
        return self._stream.wait_seconds

    @property
    def samples_served(self) -> int:
        """Samples handed out so far."""
        return self._stream.samples_served

    # -- iteration ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """A new epoch: its batches in the loader's order (the rest of a loaded state's epoch first)."""
        return self._iterate(self._shuffled())

    def _iterate(self, shuffled: bool) -> EpochIterator:
        with self._lock:
            previous = self._current
            if previous is not None and not previous.finished:
                if previous.done:
                    previous.finish()  # every batch handed out; only the look past its end was not asked for
                else:
                    self._abandon(previous)
            plan = self._cursor.begin(shuffled)
            ahead, self._ahead = self._ahead, None  # see kfast.data._epoch.load_ahead
            stream = self._stream
            adopted = ahead.seqs if ahead is not None and ahead.plan == plan else []
            if stream.outstanding != len(adopted):
                stream.close()  # what was loaded ahead belongs to another order, or to an iteration left early
                adopted = []
            it = EpochIterator(self, plan, list(adopted), stream.generation)
            self._current = it
            return it

    @property
    def _current(self) -> EpochIterator | None:
        return self._current_ref() if self._current_ref is not None else None

    @_current.setter
    def _current(self, it: EpochIterator | None) -> None:
        self._current_ref = weakref.ref(it) if it is not None else None

    def _dropped(self, it: EpochIterator) -> None:
        """`it`, this loader's latest iteration, was dropped before its end: its epoch ends and the workers stop."""
        with self._lock:
            if it.finished or it.stale:
                return
            if it.done:
                # Every batch was handed out (Keras takes an epoch's steps and never asks past them): the epoch
                # ended, and the workers, with the next epoch's first batches loading, stay for the next one.
                it.finish()
                return
            self._abandon(it)
            self._current, self._ahead = None, None
            self._stream.close()

    def _abandon(self, it: EpochIterator) -> None:
        # An epoch left early still ends: the dataset's on_epoch_end follows its on_epoch_begin, as Keras calls
        # them around its first look at one batch (the JAX and PyTorch trainers build the model so).
        it.stale = True
        if it.began:
            self._epoch_ends(it)

    def _drop_iteration(self) -> None:
        if self._current is not None and not self._current.finished:
            self._abandon(self._current)
        self._current, self._ahead = None, None
        self._stream.close()

    def _epoch_begins(self, it: EpochIterator) -> None:
        dataset = self.dataset
        if overrides(dataset, "on_epoch_begin"):
            dataset.on_epoch_begin()
            self._stream.update_dataset(dataset)
        if not self._processes and hasattr(dataset, "set_epoch"):
            dataset.set_epoch(it.plan.epoch)  # process workers set it from each task's epoch

    def _epoch_ends(self, it: EpochIterator) -> None:
        if overrides(self.dataset, "on_epoch_end"):
            self.dataset.on_epoch_end()
            self._stream.update_dataset(self.dataset)

    def __len__(self) -> int:
        return self._order.n

    def __getitem__(self, index: int) -> Any:
        """Batch `index` of what this loader reads (its shard, for training data under several ranks), in index
        order, loaded by a worker."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"FastLoader index {index} is out of range for {n} batches.")
        with self._lock:
            it = self._current
            epoch = it.plan.epoch if it is not None and not it.finished else self._cursor.next_epoch
            return self._stream.lookup(self._order.dataset_index(index % n), epoch)

    # -- lifetime -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the workers and frees shared memory. The loader restarts them if used again; an iteration
        under way goes on, its batches in flight loaded again."""
        # Without the lock: a signal's clean-up or the preemption timer closes the loader from another thread
        # while a reader waits for a batch holding it; that wait then ends with the pool closed.
        self._ahead = None
        self._stream.close()

    def skip_to_next_epoch(self) -> None:
        """Deprecated: every iteration starts an epoch of its own, so there is nothing left to skip."""
        warnings.warn("FastLoader.skip_to_next_epoch() is no longer needed: every iter(loader) and every Keras epoch "
                      "starts a new epoch at its first batch. It goes in the next release.", DeprecationWarning,
                      stacklevel=2)
        with self._lock:
            self._drop_iteration()

    def __enter__(self) -> FastLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_tf_dataset(self) -> Any:
        """Returns a `tf.data.Dataset` of one epoch of this loader's batches, prefetched."""
        from kfast.data.tf_bridge import to_tf_dataset

        return to_tf_dataset(self)
