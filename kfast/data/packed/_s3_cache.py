"""The local cache folder of an `S3Store`: shards downloaded whole, least recently used out first.

NOTE [ S3 shard cache layout ]
Each store uri has its own folder, `<root>/<bucket>-<prefix>-<hash>`: readable, and the hash (of the uri and the
layout version below) keeps two uris apart however their readable parts clash. Inside it:
  - `<tag>-<name>`: shard `name` as downloaded, where `tag` hashes the object's size and ETag. A changed object has a
    new tag, so it is downloaded again (and the old version removed then), and a cached file whose tag matches the
    listing is used with no GET: a resumed run downloads nothing it already has.
  - `.part-*`: downloads in progress, installed by `os.replace`, so a reader never sees half a shard. Two processes
    that download the same shard both write their own part; the last rename wins, with the same bytes.
  - `.lock`: `fcntl.flock`ed by whoever evicts, so that processes sharing the folder never evict at the same time.
  - `.kfast-cache.json`: the layout version and the uri, for whoever looks in the folder.
A shard's last use is its mtime, set at each use with the current time in nanoseconds: atime is not kept on
noatime or relatime mounts, and a time the kernel stamps is only as fine as its tick. Eviction removes the least
recently used shards until the folder is within its budget, except the one just handed out; a reader that has a
shard open keeps reading it after it is unlinked (POSIX).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator

LAYOUT_VERSION = 1
_PART = ".part-"
_ABANDONED_S = 3600.0  # a part untouched this long belongs to a process that died mid-download
_TAG_CHARS = 12


def default_root() -> str:
    """`$KFAST_CACHE_DIR/shards`, else `$XDG_CACHE_HOME/kfast/shards`, else `~/.cache/kfast/shards` (as tune's)."""
    root = os.environ.get("KFAST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kfast")
    return os.path.join(root, "shards")


def folder_for(root: str, bucket: str, prefix: str, uri: str) -> str:
    """The cache folder of store `uri` under `root`, created if absent."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{bucket}-{prefix}".strip("-"))[:48]
    digest = hashlib.sha256(f"{LAYOUT_VERSION}:{uri}".encode()).hexdigest()[:10]
    folder = os.path.join(os.path.abspath(os.path.expanduser(root)), f"{readable}-{digest}")
    os.makedirs(folder, exist_ok=True)
    about = os.path.join(folder, ".kfast-cache.json")
    if not os.path.exists(about):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=_PART)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"layout_version": LAYOUT_VERSION, "uri": uri}, f)
        os.replace(tmp, about)
    return folder


def cached_name(name: str, size: int, etag: str) -> str:
    """The file name of version (`size`, `etag`) of shard `name` in a cache folder."""
    return f"{hashlib.sha256(f'{size}:{etag}'.encode()).hexdigest()[:_TAG_CHARS]}-{name}"


def new_part(folder: str) -> tuple[int, str]:
    """An open file descriptor and path for a download in progress, in `folder` (so that os.replace is atomic)."""
    return tempfile.mkstemp(dir=folder, prefix=_PART)


def touch(path: str) -> None:
    """Marks `path` as used now (see the NOTE)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


@contextlib.contextmanager
def _locked(folder: str) -> Iterator[None]:
    with open(os.path.join(folder, ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def evict(folder: str, budget: int, keep: str) -> int:
    """Removes other versions of `keep`'s shard, then least recently used shards until `folder` holds at most
    `budget` bytes, never `keep` itself; returns how many shards it removed."""
    keep_name = os.path.basename(keep)
    removed = 0
    with _locked(folder):
        shards = []
        now = time.time()
        with os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):  # another process's eviction, outside our lock's reach
                    stat = entry.stat()
                    if entry.name.startswith(_PART) and now - stat.st_mtime > _ABANDONED_S:
                        os.unlink(entry.path)
                    elif not entry.name.startswith(".") and entry.is_file():
                        shards.append((stat.st_mtime_ns, stat.st_size, entry.name))
        stale = {n for _, _, n in shards if n != keep_name and n[_TAG_CHARS + 1:] == keep_name[_TAG_CHARS + 1:]}
        total = sum(size for _, size, name in shards if name not in stale)
        for _, size, name in sorted(shards):
            if name in stale or (total > budget and name != keep_name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                total -= 0 if name in stale else size
    return removed
