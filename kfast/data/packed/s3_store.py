"""Packed shards on S3-compatible object storage, read through a bounded local cache (`S3Store`).

NOTE [ S3Store's processes and requests ]
A store pickles as its settings (uri, cache folder, budget, endpoint): each process that unpickles it, and each
child forked from a process that used it, builds its own boto3 client, prefetch threads and listing on first use
(`_own`), since a client's connections and threads are not to be shared across a fork. Per process, a store lists
its prefix once (ListObjectsV2, for every shard's size and ETag; a HEAD for a name the listing lacks), and GETs a
shard only when the cache folder lacks that version of it (NOTE [ S3 shard cache layout ] in `_s3_cache`). Within
a process, one thread downloads a shard while any other that wants it waits (`_inflight`). Failures are tried
again as `_s3_retry` says.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from kfast.data.packed import _s3_cache
from kfast.data.packed import _s3_retry
from kfast.data.packed._s3_prefetch import Prefetcher

_CHUNK = 1 << 20
_DEFAULT_CACHE_BYTES = 20 << 30


@dataclasses.dataclass
class S3Stats:
    """What one process's `S3Store` has done: whole downloads, the bytes they brought, shards found in the cache
    (`local_path` with no download), shards it evicted from the cache, and reads it tried again."""

    downloads: int = 0
    bytes_downloaded: int = 0
    cache_hits: int = 0
    evictions: int = 0
    retries: int = 0


class S3Store:
    """Shards under `s3://bucket/prefix`, each downloaded whole into a bounded local cache before it is read.

    `kfast.data.packed.stores.open_store` makes one for an `s3://` uri. Any S3-compatible server works: boto3 finds
    the endpoint (`AWS_ENDPOINT_URL`), the credentials and the region where the AWS tools do. The cache folder may
    be shared by every process of a machine; together they keep it within `cache_bytes`, evicting the least
    recently used shards, so give it room for at least two shards per reading process. Credentials never appear in
    its messages, its repr or its pickle.

    Args:
        uri: `s3://bucket/prefix`, the folder of the pack.
        cache_dir: the local cache folder; the store keeps its shards in a folder of its own inside. Defaults to
            `None`: `~/.cache/kfast/shards` (`$KFAST_CACHE_DIR/shards` where that is set).
        cache_bytes: the most bytes the store's cache folder keeps (a shard being read stays, even over it).
            Defaults to `None`: 20 GiB.
        endpoint_url: the S3 server. Defaults to `None`: boto3's, from `AWS_ENDPOINT_URL` or the AWS config.

    Raises:
        ValueError: for a uri that is not `s3://bucket/...`, or a budget that is not a positive int.
        ImportError: at the first request, when boto3 is missing.
        FileNotFoundError: from a read, for a missing object or bucket.
        PermissionError: from a read, when S3 refuses the credentials.
        OSError: from a read that still failed after its retries (the message names the object and the attempts).

    Example:

    >>> store = S3Store("s3://my-bucket/packs/train", cache_bytes=4 << 30)  # nothing is requested yet
    >>> store
    S3Store('s3://my-bucket/packs/train')
    """

    def __init__(self, uri: str, *, cache_dir: str | None = None, cache_bytes: int | None = None,
                 endpoint_url: str | None = None) -> None:
        bucket, _, prefix = uri[len("s3://"):].partition("/") if uri.startswith("s3://") else ("", "", "")
        if not bucket:
            raise ValueError(f"S3Store got uri={uri!r}; it must be s3://bucket/prefix, such as "
                             "s3://my-bucket/packs/train.")
        cache_bytes = _DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes <= 0:
            raise ValueError(f"S3Store got cache_bytes={cache_bytes!r}; it must be a positive int, the most bytes its "
                             "cache keeps (leave it out for 20 GiB).")
        self.uri, self.cache_dir, self.cache_bytes, self.endpoint_url = uri, cache_dir, cache_bytes, endpoint_url
        self._bucket, self._prefix = bucket, prefix.strip("/")
        self._pid = -1  # no process owns the moving parts yet: see `_own`

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "cache_dir": self.cache_dir, "cache_bytes": self.cache_bytes,
                "endpoint_url": self.endpoint_url}

    def __setstate__(self, state: dict[str, Any]) -> None:
        S3Store.__init__(self, state["uri"], cache_dir=state["cache_dir"], cache_bytes=state["cache_bytes"],
                         endpoint_url=state["endpoint_url"])

    @property
    def stats(self) -> S3Stats:
        """This process's counts (see `S3Stats`)."""
        self._own()
        return self._stats

    def read_text(self, name: str) -> str:
        """The text of object `name` beside the shards (such as `kfast-pack.json`), read with no caching."""
        self._own()

        def get() -> bytes:
            response = self._client().get_object(Bucket=self._bucket, Key=self._key(name))
            data = response["Body"].read()
            if len(data) != response["ContentLength"]:
                raise _s3_retry.Incomplete(f"{len(data)} of {response['ContentLength']} bytes")
            return data

        return self._retrying(name, get).decode("utf-8")

    def local_path(self, name: str) -> str:
        """The path of shard `name` in the cache folder, downloaded first when the cache lacks its current version."""
        self._own()
        return self._fetch(name, counts_hit=True)

    def prefetch(self, names: list[str]) -> None:
        """Starts downloading shards `names` in the background, in order, and returns at once. A name already queued,
        downloading or cached costs no second download; names past the queue's room are left for `local_path`."""
        self._own()
        self._prefetcher.add(names)

    def close(self) -> None:
        """Ends background downloads (queued names are dropped) and closes the connections; the store stays usable."""
        if self._pid != os.getpid():
            return
        self._prefetcher.close()
        with self._lock:
            client, self._s3 = self._s3, None
        if client is not None:
            client.close()  # a prefetch still downloading fails, unseen: a reader's local_path fetches it again

    # The moving parts, one set per process (`_own` makes them).
    _lock: threading.Lock
    _listing_lock: threading.Lock  # held while this process's one listing is made
    _listing: dict[str, tuple[int, str]]  # name: (size, ETag)
    _listed: bool
    _stats: S3Stats
    _s3: Any  # the boto3 client
    _folder: str
    _inflight: dict[str, threading.Event]  # set when the download of that name under way ends
    _prefetcher: Prefetcher

    def _own(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._lock, self._listing_lock = threading.Lock(), threading.Lock()
        self._listing, self._listed, self._stats = {}, False, S3Stats()
        self._s3, self._folder, self._inflight = None, "", {}
        self._prefetcher = Prefetcher(lambda name: self._fetch(name, counts_hit=False))

    def _client(self) -> Any:
        with self._lock:
            if self._s3 is None:
                try:
                    import boto3
                except ImportError as error:
                    raise ImportError(f"S3Store needs boto3 to read {self.uri}; install it with "
                                      "pip install 'kfast[s3]'.") from error
                self._s3 = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url,
                                                          config=_s3_retry.botocore_config())
            return self._s3

    def _key(self, name: str) -> str:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"S3Store got shard name {name!r}; it must be the name of a file in {self.uri}.")
        return f"{self._prefix}/{name}" if self._prefix else name

    def _retrying(self, name: str, attempt: Any, what: str = "read") -> Any:
        def count() -> None:
            with self._lock:
                self._stats.retries += 1

        return _s3_retry.retrying(attempt, f"s3://{self._bucket}/{self._key(name)}", what, count)

    def _cache_folder(self) -> str:
        if not self._folder:
            root = self.cache_dir or _s3_cache.default_root()
            self._folder = _s3_cache.folder_for(root, self._bucket, self._prefix, self.uri)
        return self._folder

    def _version(self, name: str) -> tuple[int, str]:
        """(size, ETag) of object `name`: from this process's listing of the prefix, else a HEAD."""
        key = self._key(name)
        with self._listing_lock:
            if not self._listed:
                def list_prefix() -> dict[str, tuple[int, str]]:
                    start = f"{self._prefix}/" if self._prefix else ""
                    pages = self._client().get_paginator("list_objects_v2").paginate(
                        Bucket=self._bucket, Prefix=start, Delimiter="/")
                    return {item["Key"][len(start):]: (item["Size"], item["ETag"].strip('"'))
                            for page in pages for item in page.get("Contents", ())}

                listing = self._retrying(name, list_prefix, what="list the objects beside")
                with self._lock:
                    self._listing.update(listing)
                    self._listed = True
        if name not in self._listing:
            head = self._retrying(name, lambda: self._client().head_object(Bucket=self._bucket, Key=key))
            with self._lock:
                self._listing[name] = (head["ContentLength"], head["ETag"].strip('"'))
        return self._listing[name]

    def _fetch(self, name: str, counts_hit: bool) -> str:
        while True:
            size, etag = self._version(name)
            path = os.path.join(self._cache_folder(), _s3_cache.cached_name(name, size, etag))
            with self._lock:
                running = self._inflight.get(name)
                if running is None:
                    if _has_size(path, size):
                        _s3_cache.touch(path)
                        self._stats.cache_hits += counts_hit
                        return path
                    self._inflight[name] = running = threading.Event()
                    break
            running.wait()  # another thread downloads it: then look again (it may have failed)
        try:
            return self._download(name)
        finally:
            with self._lock:
                del self._inflight[name]
            running.set()

    def _download(self, name: str) -> str:
        folder = self._cache_folder()

        def get() -> str:
            fd, part = _s3_cache.new_part(folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    response = self._client().get_object(Bucket=self._bucket, Key=self._key(name))
                    for chunk in response["Body"].iter_chunks(_CHUNK):
                        f.write(chunk)
                    size, expected = f.tell(), response["ContentLength"]
                if size != expected:
                    raise _s3_retry.Incomplete(f"{size} of {expected} bytes")
                etag = response["ETag"].strip('"')
                path = os.path.join(folder, _s3_cache.cached_name(name, size, etag))
                os.replace(part, path)
            except BaseException:
                _remove(part)
                raise
            with self._lock:
                self._listing[name] = (size, etag)  # the object may have changed since the listing: this is it now
                self._stats.downloads += 1
                self._stats.bytes_downloaded += size
            return path

        path: str = self._retrying(name, get)
        _s3_cache.touch(path)
        evicted = _s3_cache.evict(folder, self.cache_bytes, keep=path)
        with self._lock:
            self._stats.evictions += evicted
        return path


def _has_size(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except FileNotFoundError:
        return False


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
