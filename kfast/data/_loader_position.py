"""FastLoader's position methods: `state_dict()`, `load_state_dict()` and what a checkpoint asks of it (see
`NOTE [ The data position ]` in `kfast.data.position`). A mixin of FastLoader's, apart for the size of its module:
it reads the loader's lock, cursor, order and dataset."""

from __future__ import annotations

import dataclasses
from typing import Any

from kfast.data import position
from kfast.data.position import EpochOrder


class LoaderPosition:
    """Where a FastLoader stands, as a state of a few plain values (FastLoader inherits it)."""

    _lock: Any
    _cursor: Any
    _order: Any
    _current: Any
    dataset: Any
    _drop_iteration: Any

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: the epoch under way and the batches of it handed out (none between epochs),
        its seed and shard layout, with a format version; `load_state_dict` takes it back.

        Returns:
            A dict of plain values (JSON-serialisable).

        Example:

        >>> import numpy as np, kfast
        >>> data = kfast.data.ArrayDataset(np.zeros((8, 1)), np.arange(8), batch_size=2)
        >>> loader = kfast.data.FastLoader(data, workers=1, use_multiprocessing=False, shuffle=True, seed=3)
        >>> stream = iter(loader); trained = [next(stream)[1].tolist() for _ in range(2)]
        >>> state = loader.state_dict(); state["epoch"], state["batches_done"]
        (0, 2)
        >>> again = kfast.data.FastLoader(data, workers=1, use_multiprocessing=False, shuffle=True, seed=3)
        >>> again.load_state_dict(state)
        >>> [y.tolist() for _, y in again] == [y.tolist() for _, y in stream]
        True
        >>> loader.close(); again.close()
        """
        with self._lock:
            state = self._cursor.state(self._current)
        dataset_state = self._dataset_state()
        return state if dataset_state is None else {**state, "dataset": dataset_state}

    def _dataset_state(self) -> Any:
        # A dataset's own position-defining state (a PackedDataset's permutation seed) travels with the loader's.
        # Both methods, as torchdata's Stateful has them: a dataset that can take a state back.
        state_dict: Any = getattr(self.dataset, "state_dict", None)
        if callable(state_dict) and callable(getattr(self.dataset, "load_state_dict", None)):
            return state_dict()
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next iteration go on from `state` (from `state_dict()`, or a checkpoint's, which holds every
        rank's seed and resumes on any number of ranks): the rest of its epoch in the order it had, then the
        next epochs in theirs. The recorded seed replaces the loader's.

        Args:
            state: what `state_dict()` returned.

        Raises:
            ValueError: for a state of another form, version, dataset length or sharding.
        """
        order = position.order_of(state, self._order.rank, self._order.size)
        load_dataset_state: Any = getattr(self.dataset, "load_state_dict", None)
        if order.dataset_state is not None and not callable(load_dataset_state):
            raise ValueError(f"FastLoader.load_state_dict got a state recorded with a {type(self.dataset).__name__}'s "
                             "own state (its state_dict()), but this loader's dataset has no load_state_dict(); load it "
                             "into a loader over the same kind of dataset.")
        with self._lock:
            self._drop_iteration()
            self._cursor.load(order)
            if order.dataset_state is not None:
                load_dataset_state(order.dataset_state)

    @property
    def epoch_offset(self) -> int:
        """Batches of the epoch Keras is training that were trained before it began here (after a resume)."""
        with self._lock:
            plan = self._cursor.keras_plan()
        return plan.start if plan is not None else 0

    def epoch_order(self, trained: int, finished: bool = False) -> EpochOrder:
        """This rank's order of the epoch Keras is training, `trained` batches into it by Keras's count (what a
        checkpoint records: Keras on TensorFlow loads ahead of what it trained); with `finished`, the order
        the next epoch starts with."""
        with self._lock:
            order = self._cursor.epoch_order(trained, finished)
        return dataclasses.replace(order, dataset_state=self._dataset_state())

