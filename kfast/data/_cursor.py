"""Where a FastLoader stands between its epochs: the epoch its next iteration begins, a loaded position that
iteration goes on from, and the iterations Keras began (see `NOTE [ The data position ]` in
`kfast.data.position`). The loader owns one; nothing else holds any of it."""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

from kfast.data import position
from kfast.data._loader_order import EpochPlan, LoaderOrder
from kfast.data.position import EpochOrder


class Cursor:
    """The position of a loader over `order`; `seed_given` says whether the user chose the seed."""

    def __init__(self, order: LoaderOrder, shuffled: bool, seed_given: bool) -> None:
        self.order, self.seed_given = order, seed_given
        self.next_epoch = 0  # the epoch the next iteration begins
        self.resume: EpochPlan | None = None  # a loaded position: the next iteration goes on from it
        self.last_shuffled = shuffled
        self.keras: deque[Any] = deque()  # iterations Keras began and has not ended, oldest first

    def begin(self, shuffled: bool) -> EpochPlan:
        """The plan of the iteration beginning now: the loaded position's rest, else the next epoch."""
        if self.resume is not None:
            plan, self.resume = self.resume, None
            return plan
        plan = self.order.plan(self.next_epoch, shuffled)
        self.next_epoch += 1
        self.last_shuffled = shuffled
        return plan

    def state(self, current: Any) -> dict[str, Any]:
        """`FastLoader.state_dict()`, with `current` the loader's latest iteration (or None)."""
        if self.resume is not None:
            view = self.order.view(self.resume, 0)
        elif current is not None and not current.stale and not current.done:
            view = self.order.view(current.plan, current.served)
        else:
            view = self.order.next_view(self.next_epoch, self.last_shuffled)
        return position.state_of(view, self.order.rank)

    def load(self, order: EpochOrder) -> None:
        """Makes the next iteration go on from `order` (checked against this loader's dataset and layout)."""
        ours = self.order
        if (order.total, order.sharded) != (ours.total, ours.sharded):
            raise ValueError(
                f"FastLoader.load_state_dict got the state of a loader over {order.total} batches (sharding "
                f"{order.sharded!r}); this one reads {ours.total} (sharding {ours.sharded!r}). Load the state "
                "into a loader over the same dataset.")
        recorded = order.seeds[ours.rank] if ours.rank < len(order.seeds) else order.seeds[0]
        if self.seed_given and recorded != ours.seed:
            warnings.warn(f"FastLoader got seed={ours.seed}, but the state it resumes from was trained with "
                          f"seed={recorded}; it follows the state, so that the run goes on in the order it would "
                          "have had without the interruption.", stacklevel=4)
        ours.seed = recorded
        plan = ours.resume(order) if order.done else None
        if plan is not None and not plan.indices:
            plan = None  # fewer batches left than ranks now: the epoch is over for them
            order = EpochOrder(order.seeds, order.size, order.epoch + 1, order.shuffled, order.total, order.sharded)
        self.resume = plan
        self.next_epoch = order.epoch + (1 if plan is not None else 0)
        self.last_shuffled = order.shuffled

    def keras_plan(self) -> EpochPlan | None:
        """The epoch Keras is training, or begins next: the oldest iteration Keras began and has not ended, else a
        loaded position not begun yet (Keras on TensorFlow begins reading in a thread of its own, maybe after
        the epoch's first batch hooks)."""
        while self.keras and self.keras[0].stale:
            self.keras.popleft()
        if self.keras:
            return self.keras[0].plan
        return self.resume

    def keras_ended(self) -> Any:
        """Keras ended an epoch: the iteration it was (or None)."""
        return self.keras.popleft() if self.keras_plan() is not None and self.keras else None

    def epoch_order(self, trained: int, finished: bool) -> EpochOrder:
        """See `FastLoader.epoch_order`."""
        plan = self.keras_plan()
        if plan is None:
            return self.order.next_view(self.next_epoch, self.last_shuffled)
        # At an epoch's end Keras has ended it already: the plan is the next one's, begun or not.
        return self.order.view(plan, 0 if finished else trained)
