"""Where packed shards live: a local folder, or S3-compatible object storage read through a bounded local cache.

A store is picklable (a loader's worker processes each rebuild its moving parts from the settings) and answers
three questions: the text of a small file beside the shards (`read_text`, the pack's `kfast-pack.json`), a local
path to read a shard from (`local_path`: a remote shard is fetched into the cache first), and which shards to
fetch ahead (`prefetch`). Every store is keras-free: workers import it.
"""

from __future__ import annotations

import os
from typing import Protocol


class ShardStore(Protocol):
    """What a packed dataset reads its shards through (see the module's docstring)."""

    uri: str

    def read_text(self, name: str) -> str:
        """The text of file `name` beside the shards."""

    def local_path(self, name: str) -> str:
        """A local path of shard `name`, fetched first when remote; it stays readable while open."""

    def prefetch(self, names: list[str]) -> None:
        """Starts fetching shards `names` in the background, in order; returns at once."""

    def close(self) -> None:
        """Ends background fetches."""


class LocalStore:
    """Shards in a local (or mounted network) folder: nothing to fetch.

    Example:

    >>> import tempfile, pathlib
    >>> folder = tempfile.mkdtemp(); _ = (pathlib.Path(folder) / "kfast-pack.json").write_text("{}")
    >>> LocalStore(folder).read_text("kfast-pack.json")
    '{}'
    """

    def __init__(self, folder: str) -> None:
        self.uri = os.path.abspath(folder)

    def read_text(self, name: str) -> str:
        with open(os.path.join(self.uri, name), encoding="utf-8") as f:
            return f.read()

    def local_path(self, name: str) -> str:
        return os.path.join(self.uri, name)

    def prefetch(self, names: list[str]) -> None:
        pass

    def close(self) -> None:
        pass


def open_store(uri: str, *, cache_dir: str | None = None, cache_bytes: int | None = None) -> ShardStore:
    """The store of `uri`: `s3://bucket/prefix` (object storage, see `kfast.data.packed.s3_store`) or a folder.

    Args:
        uri: where the pack is.
        cache_dir: a remote store's local cache folder. Defaults to `None`: `~/.cache/kfast/shards/`.
        cache_bytes: the most bytes a remote store's cache keeps. Defaults to `None`: 20 GiB.
    """
    if uri.startswith("s3://"):
        from kfast.data.packed.s3_store import S3Store  # boto3 only for object storage

        return S3Store(uri, cache_dir=cache_dir, cache_bytes=cache_bytes)
    if "://" in uri:
        raise ValueError(f"kfast reads packed shards from a folder or s3://bucket/prefix; got {uri!r}. Copy the pack "
                         "to a folder, or to S3-compatible storage (set AWS_ENDPOINT_URL for a server of your own).")
    return LocalStore(uri)
