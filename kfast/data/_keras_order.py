"""Which order Keras's `fit`/`evaluate`/`predict` asks of a PyDataset it is reading: shuffled or not.

Keras passes `fit(shuffle=...)` to the `PyDatasetAdapter` it wraps around a PyDataset, and the adapter
reorders the indices it asks for. A FastLoader loads ahead in an order of its own, so it must know that
choice before the epoch's first batch, and Keras never tells the dataset. The adapter is found among the
objects that refer to the loader (`gc.get_referrers`, the same live-object lookup as
`kfast._core.callback_order`): the one that holds it as `py_dataset` and is inside an epoch now (it marks
itself before calling the dataset's `on_epoch_begin`), so a finished `fit`'s adapter, not yet collected,
does not count.
"""

from __future__ import annotations

import gc
from typing import Any


def keras_shuffles(dataset: Any) -> bool | None:
    """Returns the `shuffle` of the Keras adapter reading `dataset` in its current epoch, or `None` when no
    Keras loop is reading it (a plain `for` loop, or hooks called by hand)."""
    # Matched by class name, not imported: the adapter lives in Keras's private keras.src tree.
    adapters = [o for o in gc.get_referrers(dataset)
                if any(c.__name__ == "PyDatasetAdapter" for c in type(o).__mro__)
                and getattr(o, "py_dataset", None) is dataset and getattr(o, "_within_epoch", False)]
    if not adapters:
        return None
    return any(bool(a.shuffle) for a in adapters)
