"""An `S3Store`'s read-ahead: a few daemon threads that fetch the names queued for them, in order.

The queue is bounded and `add` never waits: names past its room are left to be fetched when read. A name already
queued is not queued twice; the store itself makes a name being downloaded, or cached, cost nothing more. The
threads are daemons, so that a download under way never holds up the end of the process; `close` drops what is
queued and lets each thread end after its current download.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Callable

_log = logging.getLogger("kfast.data.packed.s3_store")


class Prefetcher:
    """Calls `fetch(name)` in `threads` background threads for each name `add`ed, at most `room` waiting."""

    def __init__(self, fetch: Callable[[str], object], threads: int = 2, room: int = 16) -> None:
        self._fetch, self._room, self._count = fetch, max(room, threads), threads
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue(self._room)
        self._queued: set[str] = set()
        self._threads: list[threading.Thread] = []

    def add(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                if name in self._queued:
                    continue
                try:
                    self._queue.put_nowait(name)
                except queue.Full:
                    break
                self._queued.add(name)
            while len(self._threads) < self._count:
                thread = threading.Thread(target=self._run, args=(self._queue,), daemon=True,
                                          name=f"kfast-s3-prefetch-{len(self._threads)}")
                thread.start()
                self._threads.append(thread)

    def close(self) -> None:
        with self._lock:
            old, self._queue = self._queue, queue.Queue(self._room)
            self._queued.clear()
            with contextlib.suppress(queue.Empty):
                while True:
                    old.get_nowait()
            for _ in self._threads:
                old.put_nowait(None)  # there is room: the queue holds at least as many as there are threads
            self._threads = []

    def _run(self, names: queue.Queue[str | None]) -> None:
        while (name := names.get()) is not None:
            with self._lock:
                self._queued.discard(name)
            try:
                self._fetch(name)
            except Exception as error:  # the reader's own fetch tries again, and raises it where it can be seen
                _log.debug("S3Store: prefetch of %s failed (%s)", name, type(error).__name__)
