"""Ctrl-C reaches a loader that waits in a thread other than the main one.

With TensorFlow, Keras pulls batches in one of TensorFlow's threads while the main thread waits inside
a TensorFlow op. Python runs its SIGINT handler only once the main thread is back in Python code, so a
batch that never came held Ctrl-C off for ever. Python also writes each signal's number to its "wakeup
fd" at once, from C: a watcher thread reads it and notes the time, and passes every byte on to whoever
held the fd before (asyncio in a notebook kernel, say), so their own handling is unchanged. A loader
waiting for a batch checks the note and gives up.
"""

import os
import signal
import socket
import threading
import time

_last = 0.0
_lock = threading.Lock()
_installed = False


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
            reader.close(), writer.close()
            return
        threading.Thread(target=_watch, args=(reader, writer, previous), name="kfast-interrupt-watch",
                         daemon=True).start()
        _installed = True


def _watch(reader, writer, previous):
    global _last
    while True:
        try:
            data = reader.recv(256)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            _last = time.monotonic()
        if previous != -1:
            try:
                os.write(previous, data)
            except OSError:
                pass


def since(start):
    """True when SIGINT arrived after monotonic time `start`."""
    return _last > start
