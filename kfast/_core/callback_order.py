"""Puts kfast's monitors first in the callback list, so every logger sees the values they add to `logs`.

Keras's `CallbackList` calls callbacks in list order and hands each the same epoch `logs` dict. A logger
(`TensorBoard`, `CSVLogger`) writes `logs` in its own `on_epoch_end`, so a value added by a callback
listed after it never reaches it. A monitor whose values belong in the epoch logs calls
`run_first(self)` from `on_train_begin`, which moves every such monitor to the front, in the order the
user listed them; the other callbacks keep their order.

NOTE [ Finding the CallbackList ]: Keras hands a callback no reference to the `CallbackList` that calls
it, and `fit` builds that list from the user's one. So the list is found among the live objects: the
`CallbackList` whose callbacks include this very callback. That depends on what the list holds, not on
who is calling (no stack frames are read), and the same lookup tells `GPUMonitor` when the `fit` that
started it is gone (a `fit` that raised never calls `on_train_end`): the list is dropped with it.
"""

from __future__ import annotations

import gc
import weakref

import keras

# Callbacks that set this class attribute to True are moved to the front by `run_first`.
MARKER = "_writes_epoch_logs"


def lists_holding(callback: keras.callbacks.Callback) -> list[keras.callbacks.CallbackList]:
    """Returns the live `CallbackList`s that hold `callback` (none when its hooks are called by hand)."""
    # type(), not isinstance(): isinstance asks an object's __class__ when its type does not match, and a
    # few objects among all of a process's (torch's deprecated reduce_op) warn or compute when asked.
    return [o for o in gc.get_objects()
            if issubclass(type(o), keras.callbacks.CallbackList) and any(c is callback for c in o.callbacks)]


def run_first(callback: keras.callbacks.Callback) -> list[weakref.ref]:
    """Moves `callback`, and every other callback marked with `MARKER`, to the front of its `CallbackList`.

    Call it from `on_train_begin`. The list is replaced rather than edited, so the loop that is calling
    `on_train_begin` finishes over the old order and every callback still gets that hook once; from the
    next hook on, the marked callbacks run first. Called outside a `CallbackList` (hooks driven by
    hand), it does nothing.

    Args:
        callback: the callback asking to run first.

    Returns:
        Weak references to the `CallbackList`s that hold `callback` (each dead once its `fit` is over and
        dropped); empty when no list holds it.

    Example:

    >>> import keras
    >>> class Monitor(keras.callbacks.Callback):
    ...     _writes_epoch_logs = True
    ...     def on_train_begin(self, logs=None):
    ...         run_first(self)
    >>> logger, monitor = keras.callbacks.Callback(), Monitor()
    >>> callbacks = keras.callbacks.CallbackList([logger, monitor])
    >>> callbacks.on_train_begin()
    >>> [type(c).__name__ for c in callbacks.callbacks]
    ['Monitor', 'Callback']
    """
    owners = lists_holding(callback)
    for owner in owners:
        marked = [c for c in owner.callbacks if getattr(c, MARKER, False)]
        if owner.callbacks[:len(marked)] != marked:
            owner.callbacks = marked + [c for c in owner.callbacks if not getattr(c, MARKER, False)]
    return [weakref.ref(owner) for owner in owners]
