"""Where the training data stands, for RankZeroCheckpoint: what a checkpoint records of it, and how a resumed
epoch goes on (see `NOTE [ The data position ]` in `kfast.data.position`)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kfast.data import position
from kfast.data._loader_order import merge
from kfast.distributed import collectives
from kfast.distributed.checkpoint import RestorePoint


class DataState:
    """The data position of one `fit` of `model` reading `loader` (a FastLoader, or None for data that cannot
    say where it is), which may go on from restore point `point`."""

    def __init__(self, model: Any, point: RestorePoint | None, loader: Any) -> None:
        self.model, self.point, self.loader = model, point, loader

    def offset(self) -> int:
        """Batches of the current epoch trained before this fit (inside a resumed epoch; else 0)."""
        return self.loader.epoch_offset if self.loader is not None else 0

    def epoch_begins(self, epoch: int) -> None:
        """At an epoch's first batch: a resumed epoch gets its metric state back (once per restore)."""
        point = self.point
        if point is None or not point.batch or epoch != point.epoch or point.metrics_restored:
            return
        point.metrics_restored = True
        if self.offset() == 0 or point.metrics is None:
            return  # the epoch runs again from its first batch (restore() said so), with fresh metrics
        variables = list(self.model.metrics_variables)
        if len(point.metrics) == len(variables):
            for variable, value in zip(variables, point.metrics):
                variable.assign(np.asarray(value, dtype=variable.dtype).reshape(variable.shape))

    def gather(self, batch: int | None, finished: bool) -> dict[str, Any] | None:
        """The `data` a checkpoint records after `batch` of this fit's epoch (None at its end), from every rank
        (one collective when there are several); None when the training data is not a FastLoader."""
        loader = self.loader
        view = None if loader is None else loader.epoch_order(0 if batch is None else batch + 1, finished)
        metrics = None if finished else [keras.ops.convert_to_numpy(v).tolist() for v in self.model.metrics_variables]
        pairs = collectives.allgather_object((view, metrics)) if collectives.size() > 1 else [(view, metrics)]
        views = [v for v, _ in pairs if v is not None]
        if len(views) < len(pairs):
            return None
        # The loader's own state_dict() form (versioned), with every rank's seed: `restore` hands it to
        # `load_state_dict`, on any number of ranks.
        return {"loader": position.state_of(merge(views), 0), "metrics": None if finished else [m for _, m in pairs]}
