"""Imported only by multiprocessing's fork server (as a preload): it removes the training process's
multiprocessing temporary directory when the fork server exits.

The fork server listens on a socket in that directory (`/tmp/pymp-*`), and the training process removes
it at a normal exit. When the training process is killed (SIGKILL, or a signal it has no handler for),
the fork server sees its pipe close and exits normally, so the directory goes with it.
"""

import atexit
import os
import shutil

from kfast.data._workers.server_env import TEMP_DIR_VARIABLE


def _remove(path, parent):
    # Only when the training process died: at a normal exit it removes the directory itself, after the
    # fork server has stopped, and would report a directory already gone.
    if os.getppid() != parent and os.path.basename(path).startswith("pymp-"):
        shutil.rmtree(path, ignore_errors=True)


if __name__ != "__main__":
    _path = os.environ.get(TEMP_DIR_VARIABLE)
    if _path:
        atexit.register(_remove, _path, os.getppid())
