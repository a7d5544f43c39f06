"""Puts kfast's monitors first in the callback list, so every logger sees the values they add to `logs`.

Keras's `CallbackList` calls callbacks in list order and hands each the same epoch `logs` dict. A logger
(`TensorBoard`, `CSVLogger`) writes `logs` in its own `on_epoch_end`, so a value added by a callback
listed after it never reaches it. A monitor whose values belong in the epoch logs calls
`run_first(self)` from `on_train_begin`: it finds the `CallbackList` that is calling it and moves every
such monitor to the front, in the order the user listed them; the other callbacks keep their order.
"""

import sys

import keras

# Callbacks that set this class attribute to True are moved to the front by `run_first`.
MARKER = "_writes_epoch_logs"

# Frames searched above `run_first` for `CallbackList.on_train_begin`: the monitor's hook is the first, and
# subclasses that call super() add one each.
_MAX_DEPTH = 8


def _calling_list(callback):
    """Returns the `CallbackList` whose hook is running `callback`'s, or `None` (hooks called by hand)."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList) and any(c is callback for c in owner.callbacks):
            return owner
        frame = frame.f_back
    return None


def run_first(callback):
    """Moves `callback`, and every other callback marked with `MARKER`, to the front of the calling list.

    Call it from `on_train_begin`. The list is replaced rather than edited, so the loop that is calling
    `on_train_begin` finishes over the old order and every callback still gets that hook once; from the
    next hook on, the marked callbacks run first. Called outside a `CallbackList` (hooks driven by
    hand), it does nothing.

    Args:
        callback: the callback asking to run first.

    Returns:
        True when the calling list was found (and is now in order), else False.

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
    owner = _calling_list(callback)
    if owner is None:
        return False
    marked = [c for c in owner.callbacks if getattr(c, MARKER, False)]
    if owner.callbacks[:len(marked)] != marked:
        owner.callbacks = marked + [c for c in owner.callbacks if not getattr(c, MARKER, False)]
    return True
