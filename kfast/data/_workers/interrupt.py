"""Ctrl-C, SIGTERM and SIGHUP reach a loader that waits in a thread other than the main one.

With TensorFlow, Keras pulls batches in one of TensorFlow's threads while the main thread waits inside
a TensorFlow op. Python runs its signal handlers only once the main thread is back in Python code, so a
batch that never came held Ctrl-C off for ever. `kfast._core.signal_handling` notes each signal the moment
it arrives, from a thread of its own; a loader waiting for a batch checks the notes and gives up.

When the main thread does not react to Ctrl-C within a moment, it is stuck in the framework waiting for a
batch. In a notebook the waiting loader then raises KeyboardInterrupt, which fails the framework's op and
ends `fit`. In a script, unwinding through the framework's half-failed op can deadlock the interpreter's
final garbage collection, so the process is ended instead, as an unhandled Ctrl-C ends it: loaders closed
(workers, shared memory, the fork server's directory), then exit status 130, as a shell reports for
Ctrl-C. A SIGTERM or SIGHUP that kfast's handler would answer by closing the loaders and dying is answered
the same way by the waiting loader (`terminated`, then `signals.end_by`).
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

from kfast._core import signal_handling

# Starts the watch of arriving signals; only possible from the main thread (elsewhere it does nothing).
install = signal_handling.watch


def since(start: float, grace: float) -> bool:
    """True when SIGINT arrived after monotonic time `start`, at least `grace` seconds ago.

    The grace leaves the main thread time to raise its own KeyboardInterrupt, which is the clean way out
    whenever it is not stuck waiting for this loader.
    """
    return signal_handling.interrupted(start, grace)


def terminated(grace: float) -> int | None:
    """The SIGTERM or SIGHUP that arrived at least `grace` seconds ago, or None.

    Only a signal that kfast's handler answers by closing the loaders counts: a handler of the user's own,
    or preemption during `fit`, decides for itself.
    """
    return signal_handling.termination(grace)


def interactive() -> bool:
    """True in a notebook kernel or an interactive interpreter, where the process must survive Ctrl-C."""
    return hasattr(sys, "ps1") or "ipykernel" in sys.modules


def end_process(message: str) -> NoReturn:
    """Says why on stderr, closes every loader, and ends the process with status 130 (Ctrl-C)."""
    # What a shell reports for Ctrl-C; no unwinding through the framework.
    signal_handling.end(128 + signal.SIGINT, f"\nKeyboardInterrupt: {message}\n")
