"""Removes what loaders of processes that no longer exist left behind: shared-memory segments and
multiprocessing's temporary directories.

A loader frees both itself when it closes, at a normal exit, on SIGTERM and SIGHUP, and when its process
is killed alone (the workers, the fork server and the resource tracker clean up after it). When a whole
process group is killed at once (a supervisor's SIGKILL after its grace period), nobody is left to do
it. The next process that starts a loader does it instead, once: a segment is named after the process
that made it (`kfast_<pid>_*`), and a temporary directory of a loader's process holds an `OWNER_FILE`
with that pid. Only those whose process is gone are removed; a pid now used by another process keeps
its files (they are left, never wrongly removed).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from kfast.data._workers import ring

OWNER_FILE = "kfast-owner-pid"
_SEGMENT = re.compile(rf"^{ring.SEGMENT_PREFIX}(\d+)_[0-9a-f]+$")
_done = False


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def mark(temp_dir: str) -> None:
    """Notes in `temp_dir` (multiprocessing's temporary directory) that this process owns it."""
    try:
        with open(os.path.join(temp_dir, OWNER_FILE), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass  # a directory that cannot be marked is one a later sweep leaves alone


def sweep(shm_dir: str = ring.SHM_DIR, temp_root: str | None = None) -> list[str]:
    """Removes this user's segments and marked temporary directories whose process is gone, once per
    process (later calls return at once). Returns the paths it removed."""
    global _done
    if _done:
        return []
    _done = True
    removed = []
    uid = os.getuid()
    for name in _listdir(shm_dir):
        match = _SEGMENT.match(name)
        path = os.path.join(shm_dir, name)
        if match and _owned(path, uid) and _gone(int(match.group(1))):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    temp_root = temp_root or tempfile.gettempdir()
    for name in _listdir(temp_root):
        path = os.path.join(temp_root, name)
        if not name.startswith("pymp-") or not _owned(path, uid):
            continue
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue  # not a loader's, or not marked: not ours to judge
        if _gone(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _owned(path: str, uid: int) -> bool:
    try:
        return os.lstat(path).st_uid == uid
    except OSError:
        return False
