"""SIGTERM and SIGHUP free FastLoader's shared memory and fork-server directory, as a normal exit does.

horovodrun stops the ranks it keeps, when another one fails, with SIGTERM (and SIGKILL 5 s later); a
closed terminal or ssh session sends SIGHUP. Python's default for both is to die on the spot without
running any finalizer: the loader's shared-memory segments are left to multiprocessing's resource
tracker (which warns about "leaked shared_memory objects") and multiprocessing's temporary directory
(`/tmp/pymp-*`, where the fork server listens) stays behind.

`watch(loader)`, called by every new FastLoader, registers the loaders' clean-up with
`kfast._core.signal_handling`, which owns the handlers: for each of the two signals whose disposition is
still the default, the handler closes every live loader that uses processes (workers stopped, segments
unlinked), removes multiprocessing's temporary directory, and then dies of the same signal, so the exit
status still says "terminated by SIGTERM" (143 in a shell). A handler of the user's own, or SIG_IGN
(`nohup`), is left alone. Further signals are ignored while the clean-up runs; it is bounded by the
loaders' own shutdown (about a second). A forked child neither closes the parent's loaders nor removes
its directory.

When the main thread waits inside a TensorFlow op for a batch that does not come, the handler cannot run;
the loader's waiting thread sees the signal (`interrupt.terminated`) and does the same in its place:
`end_by`, exit status 128 + the signal, as a shell reports it.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import weakref
from typing import Any
from typing import NoReturn

from kfast._core import signal_handling

_loaders: weakref.WeakSet[Any] = weakref.WeakSet()

# True once the process began ending (its loaders are being closed): a loader closed under a waiting
# thread's feet must not turn that into an error of its own (it would race the exit with another status).
ending = signal_handling.ending

# Runs every clean-up registered for the end of the process, the loaders' included.
clean_up = signal_handling.clean_up


def watch(loader: Any) -> None:
    """Has SIGTERM and SIGHUP close `loader` (kept by a weak reference) before the process dies."""
    _loaders.add(loader)
    signal_handling.on_termination(_close_loaders)


def end_by(signum: int, message: str) -> NoReturn:
    """Says why on stderr, closes every loader, and ends the process with status 128 + `signum`."""
    signal_handling.end_by(signum, message)


def _close_loaders() -> None:
    """Closes every live process loader and removes the fork server's directory (the process is ending)."""
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


# A forked child's loaders are its own: the parent's, copied into it, are not its to close.
os.register_at_fork(after_in_child=_loaders.clear)
