"""Elastic training on Keras 3: ranks leave and join a running job, which goes on without a restart.

Built on Horovod's elastic driver (`horovodrun --min-np A --max-np B --host-discovery-script S`, Gloo)
and its worker notifications; the state and the training loop are kfast's own, because Horovod's Keras
state class relies on Keras 2 hooks.

Progress is counted in global batches: in epoch `e`, after the ranks trained together up to global
batch `p`, step `j` on rank `r` of `n` trains batch `p + j * n + r` of the epoch's order. A membership
change keeps `(e, p)` and only changes `n`, so every batch of an epoch is trained once, except those after
the last commit before a rank was lost, which are trained again.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

import numpy as np

from kfast.distributed import _horovod  # Horovod's elastic driver: elastic_api(), restart()
from kfast.distributed import collectives
from kfast.distributed import checkpoint

if TYPE_CHECKING:
    import keras

_T = TypeVar("_T")

_HOROVOD_OP = re.compile(r"Horovod\w*(Allreduce|Allgather|Broadcast)|Horovod has been shut down|Gloo", re.I)


class ElasticState:
    """What an elastic job keeps through a membership change, committed in memory on every rank.

    `commit()` copies the model's weights, the optimizer's variables, kfast's training state (the base learning
    rate; the best checkpoint value lives in the checkpoint callback and on disk), the epoch and the position in it to host memory, then raises Horovod's
    `HostsUpdatedInterrupt` (on every rank together) if hosts were added or removed. After a lost rank the
    survivors `restore()` the last commit; then every rank, new ones included, takes rank 0's state
    (`sync()`).

    Attributes:
        epoch: the epoch being trained (counted from 0).
        position: global batches of that epoch already trained by all ranks together.
        resets: one dict per membership change: `{"epoch", "position", "size_before", "size_after", "reason"}`.
    """

    def __init__(self, model: keras.Model, epoch: int = 0) -> None:
        self.model, self.epoch, self.position = model, epoch, 0
        self.resets: list[dict[str, Any]] = []
        self._saved: dict[str, Any] | None = None
        # (timestamp, HostUpdateResult flags) from Horovod's notification service.
        self._messages: queue.Queue[tuple[float, int]] = queue.Queue()
        self._last_update: float = 0

    def _variables(self) -> list[Any]:
        optimizer = self.model.optimizer
        if not optimizer.built:
            # A joining rank has not trained yet: build the slots it will receive.
            optimizer.build(self.model.trainable_variables)
        return list(self.model.weights) + list(optimizer.variables)

    def save(self) -> None:
        self._saved = {"values": [np.array(v.numpy()) for v in self._variables()], "epoch": self.epoch,
                       "position": self.position, "training_state": dict(checkpoint.training_state(self.model))}

    def restore(self) -> None:
        """Puts back the last commit, undoing the steps trained since."""
        saved = self._saved
        if saved is None:
            raise RuntimeError("ElasticState.restore() found no commit to go back to; call commit() (or sync()) "
                               "before it.")
        for v, value in zip(self._variables(), saved["values"]):
            v.assign(value)
        self.epoch, self.position = saved["epoch"], saved["position"]
        checkpoint.training_state(self.model).clear()
        checkpoint.training_state(self.model).update(saved["training_state"])

    def sync(self) -> None:
        """Every rank takes rank 0's weights, optimizer state, epoch and position; then commits them."""
        collectives.broadcast_variables(self._variables(), root_rank=0)
        meta = collectives.broadcast_object((self.epoch, self.position, dict(checkpoint.training_state(self.model))))
        self.epoch, self.position = meta[0], meta[1]
        checkpoint.training_state(self.model).clear()
        checkpoint.training_state(self.model).update(meta[2])
        self.save()

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    # Horovod's notification service calls these two (the listener protocol of its elastic State).
    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        self._messages.put((timestamp, update_res))

    def on_reset(self) -> None:
        self._messages = queue.Queue()

    def check_host_updates(self) -> None:
        """Raises `HostsUpdatedInterrupt` on every rank at once when the driver announced new hosts."""
        _, _, interrupt, update_result = _horovod.elastic_api()
        newest, update = self._last_update, update_result.no_update
        while not self._messages.empty():
            timestamp, result = self._messages.get()
            if timestamp > newest:
                newest, update = timestamp, update | result
        # Rank 0's view decides, so that all ranks raise at the same commit.
        previous, self._last_update, update = collectives.broadcast_object((self._last_update, newest, update))
        if self._last_update > previous:
            raise interrupt(update == update_result.removed)


def _is_lost_rank(error: BaseException) -> bool:
    return _HOROVOD_OP.search(str(error)) is not None


def run(state: ElasticState, train: Callable[[ElasticState], _T]) -> _T:
    """Calls `train(state)` until it returns, re-forming the ring whenever ranks leave or join.

    On a lost rank (a collective fails) the state goes back to its last commit; on new hosts (announced
    at a commit) it is kept. Then Horovod restarts with the new membership, every rank takes rank 0's
    state, and `train(state)` is called again.

    Returns:
        What `train` returned.
    """
    manager, lost, interrupt, _ = _horovod.elastic_api()
    manager.init()
    manager.register_listener(state)
    skip_sync = False
    try:
        while True:
            size_before = collectives.size()
            try:
                if not skip_sync:
                    state.sync()
                return train(state)
            except interrupt as e:
                skip_sync, reason = e.skip_sync, "hosts changed"
            except Exception as e:  # TensorFlow wraps a failed Horovod collective in its own error types
                if not (isinstance(e, lost) or _is_lost_rank(e)):
                    raise
                state.restore()
                skip_sync, reason = False, f"lost a rank ({type(e).__name__})"
            _horovod.restart()
            state.on_reset()
            state.resets.append({"epoch": state.epoch, "position": state.position, "size_before": size_before,
                                 "size_after": collectives.size(), "reason": reason})
    finally:
        manager.remove_listener(state)
