"""Ctrl-C during Keras's `fit`, `evaluate` or `predict` over a FastLoader ends a script within a bound.

Each of the three calls is wrapped so that, while it runs with a FastLoader among its arguments (the data or
`validation_data`), `kfast.data._workers.interrupt` knows it is under way: a Ctrl-C in a script after which
such a call neither raises nor returns within the bound (20 s) is the framework stuck, and the process is
ended with every thread's stack on stderr, its loaders closed, status 130. A call that stops in time, as
when the script catches the KeyboardInterrupt and goes on, is left alone; notebooks are never ended.

Nothing else depends on the wrap: were it gone (a Keras release that renames the methods),
tests/data/test_keras_guard.py fails, and Ctrl-C would behave as before.
"""

from __future__ import annotations

import functools
from typing import Any

from kfast.data._workers import interrupt

KINDS = ("fit", "evaluate", "predict")


def _reads_loader(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(hasattr(value, "_keras_reading") for value in (*args, *kwargs.values()))  # a FastLoader


def _wrap(original: Any, kind: str) -> Any:
    @functools.wraps(original)
    def call(model: Any, *args: Any, **kwargs: Any) -> Any:
        if not _reads_loader(args, kwargs):
            return original(model, *args, **kwargs)
        with interrupt.keras_call(kind):
            return original(model, *args, **kwargs)

    call.__kfast_guarded__ = True  # type: ignore[attr-defined]
    return call


def install(model_class: Any) -> None:
    """Wraps `model_class.fit`, `.evaluate` and `.predict` (Keras's `Model`), once."""
    for kind in KINDS:
        original = getattr(model_class, kind)
        if not getattr(original, "__kfast_guarded__", False):
            setattr(model_class, kind, _wrap(original, kind))
