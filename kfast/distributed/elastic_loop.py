"""`kfast.distributed.elastic_fit`: `model.fit` for an elastic job, whose ranks may leave and join."""

from __future__ import annotations

from typing import Any

import keras

from kfast._core import topology
from kfast._core.checks import check_int
from kfast.data.loader import FastLoader
from kfast.data.sharding import ShardedDataset
from kfast.distributed import collectives
from kfast.distributed import elastic


class _EpochShard(ShardedDataset):
    """One rank's batches of what is left of one epoch; the dataset's order is that epoch's on every rank."""

    def __init__(self, dataset: Any, epoch: int, rank: int, size: int, start: int) -> None:
        super().__init__(dataset, rank, size, start=start)
        self.epoch = epoch
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        # Each loader lives for one epoch, and counts it as its epoch 0: the job's epoch decides the order.
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)


class _Commit(keras.callbacks.Callback):
    """Commits the elastic state every `every` steps, counting global batches from `start` on `size` ranks.

    Not at the fit's last step (`steps`): the epoch-end commit follows it, after the epoch's callbacks. A
    reset raised at a commit there would restore a position with no batch left for the ranks, and the
    epoch would count as done without its `on_epoch_end` (no checkpoint, no logs for it)."""

    def __init__(self, state: elastic.ElasticState, every: int, size: int, steps: int) -> None:
        super().__init__()
        self.state, self.every, self.size, self.start, self.steps = state, every, size, state.position, steps

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if (batch + 1) % self.every == 0 and batch + 1 < self.steps:
            self.state.position = self.start + (batch + 1) * self.size
            self.state.commit()


def elastic_fit(model: keras.Model, dataset: Any, *, epochs: int, validation_data: Any = None, initial_epoch: int = 0,
                commit_every: int = 20, callbacks: list[keras.callbacks.Callback] | None = None,
                verbose: int | str | None = None, workers: int | None = None, use_multiprocessing: bool = True,
                max_queue_size: int | None = None) -> elastic.ElasticState:
    """Trains `model` on `dataset` like `model.fit`, going on when ranks leave or join the job.

    Launch with `kfast launch --elastic` (or `horovodrun --min-np A --max-np B --host-discovery-script S`).
    Every `commit_every` steps, and at each epoch end, the ranks commit the weights, optimizer state,
    epoch and position in memory. When a rank is lost, the others go back to the last commit, re-form
    the ring and go on with the batches still to train in the epoch, split over the ranks that are left;
    a new rank joins at the next commit and takes rank 0's state. The learning rate follows the number of
    ranks through `LearningRateWarmup` (from `kfast.distributed.default_callbacks`), which rescales the
    same base rate at each change. Checkpoints (`RankZeroCheckpoint`) and `restore()` still serve full
    restarts. Without an elastic launch it trains as `fit` would, with the commits.

    The batch order must be the same on every rank: order batches by epoch with `set_epoch(epoch)` (as
    `kfast.data.ArrayDataset(shuffle=True)` does), not with a random `on_epoch_end`.

    Args:
        model: a compiled Keras model with `keras.Input` (a joining rank builds its state from it), its
            optimizer a `kfast.DistributedOptimizer`.
        dataset: indexable batches (`__len__`, `__getitem__`), as for `FastLoader`.
        epochs: epochs to train.
        validation_data: indexable validation batches, split over the ranks of the moment at each epoch's
            end. Defaults to `None`.
        initial_epoch: the epoch to start at (after `restore()` from a checkpoint). Defaults to `0`.
        commit_every: steps between commits; fewer loses less work, more costs less. Defaults to `20`.
        callbacks: Keras callbacks for each epoch's `fit`. Defaults to `None`.
        verbose: `fit`'s verbosity. Defaults to `None`: progress on rank 0 only.
        workers: the FastLoader's workers. Defaults to `None`: one per usable CPU core.
        use_multiprocessing: the FastLoader's processes (`True`) or threads. Defaults to `True`.
        max_queue_size: the FastLoader's queue depth. Defaults to `None`: twice the workers, at least 4.

    Returns:
        The `ElasticState`: `epoch`, and `resets`, one entry per membership change.

    Raises:
        RuntimeError: on the JAX engine with several processes, whose membership is fixed.

    Example:

    >>> import keras, numpy as np, kfast
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse", jit_compile=False)
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=8, shuffle=True)
    >>> state = kfast.distributed.elastic_fit(model, data, epochs=2, commit_every=4, use_multiprocessing=False,
    ...                                       verbose=0)
    >>> state.epoch, state.resets
    (2, [])
    """
    if topology.one_step_for_all() and topology.size() > 1:
        raise RuntimeError("elastic_fit() needs the Horovod engine (Keras on TensorFlow): JAX's processes are fixed "
                           "for the whole job. On JAX, train with model.fit and default_callbacks(dir), whose step "
                           "checkpoints and preemption stop let a job be restarted on other machines.")
    check_int("elastic_fit", "epochs", epochs)
    check_int("elastic_fit", "commit_every", commit_every, hint="steps between in-memory commits")
    callbacks = list(callbacks or [])
    check_int("elastic_fit", "initial_epoch", initial_epoch, least=0)
    state = elastic.ElasticState(model, epoch=initial_epoch)

    def train(state):
        # A new ring may have another size: trace the train step again rather than reuse the old one.
        model.make_train_function(force=True)
        def loader_of(data):
            # In index order: commits count positions in the epoch's order, the same on every rank (set_epoch);
            # a loader's own permutation, seeded differently on each rank, would skip and repeat batches.
            return FastLoader(data, training=True, workers=workers, use_multiprocessing=use_multiprocessing,
                              max_queue_size=max_queue_size, shuffle=False)

        while state.epoch < epochs:
            size = collectives.size()
            if len(dataset) - state.position < size:  # fewer batches left than ranks: the epoch is done
                state.epoch, state.position = state.epoch + 1, 0
                state.commit()
                continue
            shard = _EpochShard(dataset, state.epoch, collectives.rank(), size, state.position)
            # Validation is split over this epoch's ranks too (FastLoader shards by the current size).
            val = loader_of(validation_data) if validation_data is not None else None
            try:
                with loader_of(shard) as loader:
                    model.fit(loader, validation_data=val, initial_epoch=state.epoch, epochs=state.epoch + 1,
                              verbose=collectives.verbose() if verbose is None else verbose,
                              callbacks=[_Commit(state, commit_every, size, len(loader)), *callbacks])
            finally:
                if val is not None:
                    val.close()
            state.epoch, state.position = state.epoch + 1, 0
            state.commit()
            if model.stop_training:  # EarlyStopping and friends end the job, not only this epoch's fit
                break
        return state

    return elastic.run(state, train)
