"""SIGTERM and SIGHUP free FastLoader's shared memory and fork-server directory, as a normal exit does.

horovodrun stops the ranks it keeps, when another one fails, with SIGTERM (and SIGKILL 5 s later); a
closed terminal or ssh session sends SIGHUP. Python's default for both is to die on the spot without
running any finalizer: the loader's shared-memory segments are left to multiprocessing's resource
tracker (which warns about "leaked shared_memory objects") and multiprocessing's temporary directory
(`/tmp/pymp-*`, where the fork server listens) stays behind.

`watch(loader)`, called by every new FastLoader, installs once, and only from the main thread, a handler
for each of the two signals whose disposition is still the default. The handler closes every live loader
that uses processes (workers stopped, segments unlinked), removes multiprocessing's temporary directory,
and then dies of the same signal by its default action, so the exit status still says "terminated by
SIGTERM" (143 in a shell). A handler of the user's own, or SIG_IGN (`nohup`), is left alone. Further
signals are ignored while the clean-up runs; it is bounded by the loaders' own shutdown (about a second).

Python runs signal handlers in the main thread between bytecodes: when the main thread waits inside a
TensorFlow op, the clean-up starts as the op returns (Keras comes back to Python after every step). When
the op waits for a batch that does not come, the loader's waiting thread sees the signal (`interrupt`
notes it) and does the same in its place: `end_by`, exit status 128 + the signal, as a shell reports it.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import signal
import threading
import weakref
from typing import Any

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_loaders: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_installed = False
_owner = None  # the pid that installed the handlers; a forked child (a Keras or user pool) inherits them
_ending = False


def watch(loader):
    """Has SIGTERM and SIGHUP close `loader` (kept by a weak reference) before the process dies."""
    global _installed, _owner
    with _lock:
        _loaders.add(loader)
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        _installed = True
        _owner = os.getpid()
        for signum in SIGNALS:
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _handle)


def _handle(signum, frame):
    if os.getpid() != _owner:
        # A forked child (say Keras's own process pool, which it stops with SIGTERM) inherited this handler
        # and the parent's loaders: they are not its to close, nor is the parent's directory to remove.
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        os._exit(128 + signum)
    for s in SIGNALS:
        if signal.getsignal(s) is _handle:
            signal.signal(s, signal.SIG_IGN)
    try:
        clean_up()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        os._exit(128 + signum)  # only reached if the signal is blocked in this thread


def handler():
    """The handler `watch` installs (for telling it from a user's own)."""
    return _handle


def end_by(signum, message):
    """Says why on stderr, closes every loader, and ends the process with status 128 + `signum`."""
    import sys

    sys.stderr.write(f"\n{signal.Signals(signum).name}: {message}\n")
    sys.stderr.flush()
    try:
        clean_up()
    finally:
        os._exit(128 + signum)  # not from the main thread: no re-raising the signal, no unwinding


def ending():
    """True once `clean_up` began: the process is ending, and a loader closed under a waiting thread's feet
    must not turn that into an error of its own (it would race the exit with another status)."""
    return _ending


def clean_up():
    """Closes every live process loader and removes the fork server's directory (the process is ending)."""
    global _ending
    _ending = True
    used_processes = False
    for loader in list(_loaders):
        try:
            if loader.settings["use_multiprocessing"]:
                used_processes = True
                loader.close()
        except Exception:  # noqa: BLE001 - the process is going; free what can be freed
            pass
    if used_processes:
        # The fork server's directory: what multiprocessing removes at a normal exit.
        temp_dir = multiprocessing.util.get_temp_dir()
        if os.path.basename(temp_dir).startswith("pymp-"):
            shutil.rmtree(temp_dir, ignore_errors=True)
