"""Where the training data stands, for RankZeroCheckpoint: what a checkpoint records of it, and how a resumed
epoch goes on (see `NOTE [ The data position ]` in `kfast.data.position`)."""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from kfast._core import fit_timing
from kfast.data import position as data_position
from kfast.data._loader_order import merge
from kfast.distributed import _horovod as distributed
from kfast.distributed.checkpoint import RestorePoint

# Restore points whose epoch a fit has resumed already: a later fit from the same point starts afresh.
_resumed: set[int] = set()


class DataState:
    """The data position of one `fit` of `model`, which may go on from restore point `point`."""

    def __init__(self, model: Any, point: RestorePoint | None) -> None:
        self.model, self.point = model, point

    def _loader(self) -> Any:
        return data_position.training_loader(self.model)

    def offset(self) -> int:
        """Batches of the current epoch trained before this fit (inside a resumed epoch; else 0)."""
        return data_position.epoch_offset(self.model)

    def prepare(self) -> None:
        """When training begins: a resumed epoch's metric state needs the compiled metrics built, which Keras
        does at the first step; they are built now from the first batch still to train (loaded, not consumed)."""
        point, loader = self.point, data_position.taker()
        if point is not None and point.metrics is not None and loader is not None and id(point) not in _resumed:
            fit_timing.build_from_batch(self.model, loader[0], "kfast.distributed.restore", metrics=True)

    def epoch_begins(self, epoch: int, warn: bool) -> None:
        """At an epoch's first batch: a resumed epoch gets its metric state back, or a warning when its data
        could not go on where it stood."""
        point = self.point
        if point is None or not point.batch or epoch != point.epoch or id(point) in _resumed:
            return
        _resumed.add(id(point))
        loader = self._loader()
        if loader is None or loader.epoch_offset == 0:
            if warn:
                warnings.warn(
                    f"kfast restored {point.path}, saved {point.batch} batch(es) into epoch {epoch + 1}, but this fit's "
                    "training data is not the kfast.data.FastLoader that was trained on (arrays, tf.data and plain "
                    f"PyDatasets cannot say where they were): epoch {epoch + 1} runs again from its first batch. Wrap "
                    "the data in kfast.data.FastLoader to resume inside the epoch.", stacklevel=4)
            return
        variables = list(self.model.metrics_variables)
        if point.metrics is not None and len(point.metrics) == len(variables):
            for variable, value in zip(variables, point.metrics):
                variable.assign(np.asarray(value, dtype=variable.dtype).reshape(variable.shape))

    def gather(self, batch: int | None, finished: bool) -> dict[str, Any] | None:
        """The `data` a checkpoint records after `batch` of this fit's epoch (None at its end), from every rank
        (one collective when there are several); None when the training data is not a FastLoader."""
        loader = self._loader()
        view = None if loader is None else loader.epoch_order(0 if batch is None else batch + 1, finished)
        metrics = None if finished else [keras.ops.convert_to_numpy(v).tolist() for v in self.model.metrics_variables]
        pairs = distributed.allgather_object((view, metrics)) if distributed.size() > 1 else [(view, metrics)]
        views = [v for v, _ in pairs if v is not None]
        if len(views) < len(pairs):
            return None
        return {"order": merge(views).as_dict(), "metrics": None if finished else [m for _, m in pairs]}
