"""BroadcastState: every rank starts from rank 0's weights and optimizer state."""

from __future__ import annotations

import warnings
from typing import Any

import keras

from kfast._core import keras_reads
from kfast._core.checks import check_int
from kfast._core import topology
from kfast.distributed import collectives
from kfast.distributed.optimizer import unwrap_for_saving
from kfast.distributed.steps import check_equal_steps


class BroadcastState(keras.callbacks.Callback):
    """Copies weights and optimizer state from `root_rank` to every rank when training begins.

    Ranks build their models independently (different random initial weights, or a resume that only
    rank 0 read from disk); this makes them identical before the first step. A model that is not built
    when training begins (no `Input` layer, and no checkpoint restored) gets its variables only from the
    first batch: its state is then broadcast right after that batch, as Horovod's own callback does, so
    every rank still trains on identical weights from the second step on. It also turns off XLA for the
    model, since Horovod's collectives have no XLA kernels, and says so once.

    It checks, at the end of the first part of each epoch that trains, that `fit` did not train on a FastLoader
    that every rank reads whole (one built without `training=True`): each rank would train on every batch, so
    it raises a ValueError naming the fix, on every rank alike.

    First of all it checks that every rank's epoch has the same number of steps (each step ends in an
    allreduce, so a rank with one step more would wait for ever): unequal or unknown counts raise
    `kfast.distributed.UnequalStepsError` on every rank before the first step, naming each rank's count.

    Args:
        root_rank: the rank whose state wins. Defaults to `0`.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> history = model.fit(data, epochs=1, verbose=0, callbacks=[kfast.callbacks.BroadcastState()])
    >>> len(history.history["loss"])
    1
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        check_int("BroadcastState", "root_rank", root_rank, least=0, hint="a rank")
        self.root_rank = root_rank
        self._warned = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        unwrap_for_saving(self.model)  # the user's own model.save then opens in plain Keras
        if collectives.size() == 1:
            return
        check_equal_steps(self.params.get("steps"))
        if self.model.jit_compile and not topology.one_step_for_all():  # JAX's steps are XLA's own
            self.model.jit_compile = False
            self.model.make_train_function(force=True)
            self.model.make_test_function(force=True)
            if not self._warned and collectives.is_chief():
                warnings.warn("kfast turned XLA off for this model (jit_compile=False): Horovod's collectives "
                              "cannot run inside XLA. Pass jit_compile=False to compile() to silence this.",
                              stacklevel=2)
            self._warned = True
        # Every rank sees the same model, so every rank takes the same branch and the collectives match.
        self._pending = not self.model.built
        if not self._pending:
            self._broadcast()

    def _broadcast(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        state = list(self.model.variables) + (list(optimizer.variables) if optimizer is not None else [])
        collectives.broadcast_variables(state, root_rank=self.root_rank)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._reads_before = keras_reads.whole_reads()
        self._checking = collectives.size() > 1 and not topology.one_step_for_all()
        keras_reads.training_window(True)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._training_read()  # fit's validation: the training part of the epoch is over

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._training_read()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        keras_reads.training_window(False)

    def _training_read(self) -> None:
        keras_reads.training_window(False)
        if not getattr(self, "_checking", False):
            return
        self._checking = False
        if keras_reads.whole_reads() != self._reads_before:
            raise ValueError(
                f"fit() trained on a FastLoader that each of the {collectives.size()} ranks reads whole: every rank "
                "trained on every batch. Build the data fit trains on with kfast.data.FastLoader(dataset, "
                "training=True), which gives each rank its own shard (and shuffles it each epoch); keep "
                "FastLoader(dataset) for evaluate, predict and validation_data.")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if getattr(self, "_pending", False):
            self._pending = False
            self._broadcast()
