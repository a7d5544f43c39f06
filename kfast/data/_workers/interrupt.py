"""Ctrl-C reaches a loader that waits in a thread other than the main one.

With TensorFlow, Keras pulls batches in one of TensorFlow's threads while the main thread waits inside
a TensorFlow op. Python runs its SIGINT handler only once the main thread is back in Python code, so a
batch that never came held Ctrl-C off for ever. Python also writes each signal's number to its "wakeup
fd" at once, from C: a watcher thread reads it and notes the time, and passes every byte on to whoever
held the fd before (asyncio in a notebook kernel, say), so their own handling is unchanged. A loader
waiting for a batch checks the note and gives up.

The same note is kept for SIGTERM and SIGHUP, whose handler (`signals`) frees the loaders' memory and
ends the process: when the main thread cannot run it, the waiting loader does the same (see `terminated`).

When the main thread does not react within a moment, it is stuck in the framework waiting for a batch.
In a notebook the waiting loader then raises KeyboardInterrupt, which fails the framework's op and ends
`fit`. In a script, unwinding through the framework's half-failed op can deadlock the interpreter's
final garbage collection, so the process is ended instead, as an unhandled Ctrl-C ends it: loaders
closed (workers, shared memory, the fork server's directory), then exit status 130, as a shell reports
for Ctrl-C.
"""

import os
import sys
import signal
import socket
import threading
import time

_last = 0.0
_terminating: tuple[int, float] | None = None  # (signal, monotonic time) of the first SIGTERM or SIGHUP
_TERMINATING = {getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)}
_lock = threading.Lock()
_installed = False
_listeners: list = []  # called from the watcher thread with each signal's number, as it arrives


def listen(listener):
    """Has `listener(signum)` called, from the watcher thread, for each signal as soon as it arrives (even
    while the main thread is stuck in the framework); `install()` must have run in the main thread."""
    _listeners.append(listener)


def unlisten(listener):
    """Stops calling `listener`."""
    if listener in _listeners:
        _listeners.remove(listener)


def _forget_in_child():
    # A forked child (Keras's own process pool, say) shares the parent's wake-up socket: a signal sent to
    # the child (Keras stops its children with SIGTERM) would reach the parent's watcher and read as the
    # parent's own. The child writes its signals nowhere instead, and starts unwatched.
    global _installed, _last, _terminating
    _installed, _last, _terminating = False, 0.0, None
    _listeners.clear()
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass  # forked from a thread other than the main one: Python has no wake-up fd in that thread


os.register_at_fork(after_in_child=_forget_in_child)


def install():
    """Starts watching for SIGINT; only possible from the main thread (elsewhere it does nothing)."""
    global _installed
    with _lock:
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            reader.close()
            writer.close()
            return
        threading.Thread(target=_watch, args=(reader, writer, previous), name="kfast-interrupt-watch",
                         daemon=True).start()
        _installed = True


def _watch(reader, writer, previous):
    global _last, _terminating
    while True:
        try:
            data = reader.recv(256)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            _last = time.monotonic()
        arrived = [s for s in data if s in _TERMINATING]
        if arrived and _terminating is None:
            _terminating = (arrived[0], time.monotonic())
        for listener in list(_listeners):
            for signum in data:
                try:
                    listener(signum)
                except Exception:  # noqa: BLE001 - a listener's failure must not stop the watch
                    pass
        if previous != -1:
            try:
                os.write(previous, data)
            except OSError:
                pass


def since(start, grace):
    """True when SIGINT arrived after monotonic time `start`, at least `grace` seconds ago.

    The grace leaves the main thread time to raise its own KeyboardInterrupt, which is the clean way out
    whenever it is not stuck waiting for this loader.
    """
    return _last > start and time.monotonic() - _last >= grace


def terminated(grace):
    """The SIGTERM or SIGHUP that arrived at least `grace` seconds ago, or None.

    Only a signal whose handler is still kfast's counts: a handler of the user's own decides for itself.
    """
    from kfast.data._workers import signals

    if _terminating is None or time.monotonic() - _terminating[1] < grace:
        return None
    signum = _terminating[0]
    return signum if signal.getsignal(signum) is signals.handler() else None


def interactive():
    """True in a notebook kernel or an interactive interpreter, where the process must survive Ctrl-C."""
    return hasattr(sys, "ps1") or "ipykernel" in sys.modules


def end_process(message):
    """Says why on stderr, closes every loader, and ends the process with status 130 (Ctrl-C)."""
    from kfast.data._workers import signals

    sys.stderr.write(f"\nKeyboardInterrupt: {message}\n")
    sys.stderr.flush()
    try:
        signals.clean_up()
    finally:
        sys.stdout.flush()
        os._exit(128 + signal.SIGINT)  # what a shell reports for Ctrl-C; no unwinding through the framework
