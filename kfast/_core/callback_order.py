"""`ordered`: puts the callbacks that write epoch logs ahead of those that read them, as the list's builder.

Keras's `CallbackList` calls callbacks in list order and hands each the same epoch `logs` dict. A logger
(`TensorBoard`, `CSVLogger`) writes `logs` in its own `on_epoch_end`, so a value added by a callback
listed after it never reaches it (Keras's `History` and progress bar are appended last, and see all).

NOTE [ Whoever builds the list orders it ]: Keras hands a callback no reference to the `CallbackList`
that calls it, so a callback cannot move itself without searching the heap or the stack for the list.
Instead, whoever builds the list orders it, as Keras's `CallbackList._add_default_callbacks` appends
`History` last and Lightning's callback connector moves checkpoints last: `ordered` here, called by
`kfast.distributed.default_callbacks`, the recipes, and users for their own lists. A callback class marks
itself with `MARKER = True` to be moved ahead.
"""

from __future__ import annotations

from collections.abc import Iterable

import keras

# Callbacks whose class sets this attribute to True write values into the epoch logs; `ordered` puts
# them first.
MARKER = "_writes_epoch_logs"


def writes_epoch_logs(callback: keras.callbacks.Callback) -> bool:
    """Whether `callback` adds values to the epoch logs that the callbacks after it read."""
    return bool(getattr(callback, MARKER, False))


def ordered(callbacks: Iterable[keras.callbacks.Callback] | None) -> list[keras.callbacks.Callback]:
    """Returns `callbacks` with kfast's monitors first, so every logger records the values they add.

    Keras calls callbacks in list order with one shared epoch `logs` dict, so a callback that reads the
    logs (`TensorBoard`, `CSVLogger`, or `MetricAverage` averaging them over ranks) sees only what the
    callbacks before it added. Use it whenever a monitor and a logger share a list. `ordered` moves
    the callbacks that add values to the epoch logs (`ThroughputMonitor`, `GPUMonitor`) ahead of all the
    others, keeping the order you gave within each group; `History` and the progress bar, which Keras
    appends itself, come last anyway. `kfast.distributed.default_callbacks` and the recipes return lists
    ordered this way. The list you pass is left as it was.

    Args:
        callbacks: the callbacks for `model.fit`, or `None`.

    Returns:
        A new list of the same callbacks, the monitors first.

    Raises:
        ValueError: for an item that is not a `keras.callbacks.Callback`.

    Example:

    >>> import keras, numpy as np, kfast.callbacks
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    >>> model.compile("sgd", "mse")
    >>> data = kfast.data.ArrayDataset(np.ones((64, 4)), np.ones(64), batch_size=16)
    >>> csv = keras.callbacks.CSVLogger("log.csv")
    >>> callbacks = kfast.callbacks.ordered([csv, kfast.callbacks.ThroughputMonitor(batch_size=16)])
    >>> [type(c).__name__ for c in callbacks]
    ['ThroughputMonitor', 'CSVLogger']
    >>> _ = model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    >>> with open("log.csv") as f:
    ...     "samples_per_second" in f.readline().split(",")
    True
    """
    items = list(callbacks or [])
    for item in items:
        if not isinstance(item, keras.callbacks.Callback):
            raise ValueError(f"ordered got {type(item).__name__} among the callbacks; pass keras.callbacks.Callback "
                             "instances, the list you would give model.fit(callbacks=...).")
    return [c for c in items if writes_epoch_logs(c)] + [c for c in items if not writes_epoch_logs(c)]
