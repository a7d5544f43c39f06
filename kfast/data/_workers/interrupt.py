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

The framework can also get stuck after Ctrl-C without any loader waiting (CI once saw a script's `fit` over
a FastLoader neither raise nor end for a minute after Ctrl-C, with no Python traceback: the main thread never
got back to Python code to raise it). So SIGINT passes through kfast's handler, which notes that the main thread
ran it (`signal_handling.hear_answers`), and a FastLoader counts as read by Keras between its data adapter's
`on_epoch_begin` and `on_epoch_end` (`keras_read_begins`). In a script, a Ctrl-C that comes while Keras reads a
FastLoader starts a timer; if the main thread has not run the handler when it runs out (`stop_bound()`, 20 s
unless `KFAST_CTRL_C_BOUND_S` says otherwise; 0 turns it off), every thread's Python stack is written to stderr
and the process ends as above. A main thread that answered, as when the script catches the KeyboardInterrupt
and goes on (even to evaluate in its handler), is left alone.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import signal
import sys
import threading
import weakref
from typing import Any
from typing import NoReturn

from kfast._core import signal_handling

BOUND_VARIABLE = "KFAST_CTRL_C_BOUND_S"
_DEFAULT_BOUND_S = 20.0

# token -> the FastLoader a Keras epoch under way reads. No lock: a mark may end from a generator's finalizer,
# run by the garbage collector in any thread at any point; single dict operations are atomic under the GIL.
_reads: dict[int, weakref.ref[Any]] = {}
_tokens = itertools.count()


def install() -> None:
    """Starts the watch of arriving signals (only from the main thread; elsewhere it does nothing) and has
    Ctrl-C check that the Keras calls under way stop in time.

    Raises:
        ValueError: for a `KFAST_CTRL_C_BOUND_S` that is not a number (said here, not at Ctrl-C).
    """
    stop_bound()
    signal_handling.watch()
    signal_handling.hear_answers()
    signal_handling.on_interrupt(_heard_interrupt)


def stop_bound() -> float | None:
    """Seconds a Keras call over a FastLoader has to stop after Ctrl-C in a script; None when turned off."""
    text = os.environ.get(BOUND_VARIABLE, "").strip()
    try:
        bound = float(text) if text else _DEFAULT_BOUND_S
    except ValueError:
        raise ValueError(f"{BOUND_VARIABLE}={text!r} is not a number of seconds; set it to one (0 turns the bound "
                         f"off), or unset it for the default of {_DEFAULT_BOUND_S:g} s.") from None
    return bound if bound > 0 else None


def keras_read_begins(loader: Any) -> int:
    """Marks a Keras epoch over `loader` as under way; returns its token for `keras_read_ends`. A loader that is
    gone, or closed, reads nothing any more (an epoch ended by an exception never gets its end)."""
    token = next(_tokens)
    _reads[token] = weakref.ref(loader)
    return token


def _reading() -> bool:
    return any(getattr(ref(), "_read_token", None) == token for token, ref in dict(_reads).items())


def keras_read_ends(token: int) -> None:
    """Marks the Keras epoch of `token` as over."""
    _reads.pop(token, None)


def _heard_interrupt() -> None:
    """From the watch thread, at each Ctrl-C (just noted): in a script where Keras reads a FastLoader, times the
    main thread's answer."""
    # A SIGINT handler installed after kfast's owns this Ctrl-C: whether the main thread answered it is not kfast's
    # to say, also once that handler gives kfast's back. A notebook survives Ctrl-C.
    if not signal_handling.hears_answers() or interactive() or not _reading():
        return
    bound = stop_bound()
    if bound is None:
        return
    timer = threading.Timer(bound, _check_answered, (signal_handling.last_interrupt(), bound))
    timer.daemon = True
    timer.start()


def _check_answered(arrived: float, bound: float) -> None:
    if not _reading() or not signal_handling.hears_answers() or signal_handling.answered(arrived):
        return
    sys.stderr.write(f"\nkfast: Ctrl-C {bound:g} s ago has not reached Python's main thread, which is inside a Keras "
                     "call reading a FastLoader. Where every thread is:\n")
    try:
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (AttributeError, OSError, ValueError):
        pass  # a stderr without a file descriptor: the message below still says what happened
    end_process(f"Ctrl-C, and the Keras call did not stop within {bound:g} s ({BOUND_VARIABLE}): it is stuck in the "
                "framework. FastLoader closed its workers and ended the process.")


def since(start: float, grace: float) -> bool:
    """True when SIGINT arrived after monotonic time `start`, at least `grace` seconds ago.

    The grace leaves the main thread time to raise its own KeyboardInterrupt, which is the clean way out
    whenever it is not stuck waiting for this loader. A Ctrl-C the main thread answered does not count (a script
    that catches KeyboardInterrupt and evaluates in its handler must not be ended by it).
    """
    return signal_handling.interrupted(start, grace) and not (
        signal_handling.hears_answers() and signal_handling.answered(signal_handling.last_interrupt()))


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
