"""The shared-memory ring behind FastLoader's worker processes: equal slots in one `/dev/shm` segment.

Ownership. The loader creates and unlinks the segment; workers attach to it by name and only write.
Segments are named `kfast_<pid>_<random>` after the creating process, so `ls /dev/shm` (and a leak
check) can tell whose they are.
A slot is lent to one task at a time (`acquire`). When its batch comes back, `export` hands out the
leaves as views of one fresh per-batch array (the "export"); a weak reference to that export returns
the slot to the free list when the last leaf or view of it is gone, so a batch the user still holds is
never overwritten. Nothing here depends on reference counts.
The weak reference's callback is `deque.append`, C code: a Python callback can be entered at any
bytecode when the batch is freed, and a Ctrl-C landing inside it is printed as "Exception ignored" and
lost (the run went on training). The dead references are turned back into slots at the next `acquire`.

Room. `/dev/shm` is a size-limited tmpfs (64 MB in Docker by default). A segment is created sparse, and
writing a page tmpfs cannot supply kills the writer with SIGBUS, so `create` reserves every page up
front with `posix_fallocate`, which fails cleanly (ENOSPC) instead; callers then shrink the ring or
send batches pickled.
"""

from __future__ import annotations

import collections
import errno
import functools
import math
import os
import secrets
import weakref
from multiprocessing import shared_memory

import numpy as np

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "kfast_"


class Segment(shared_memory.SharedMemory):
    """A shared-memory segment that batches may outlive: it stays mapped until their last view is freed."""

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass  # batches still use the mapping; the memory goes when the last of them is freed

    def release(self):
        """Unlinks the segment (its name); the memory lives on while batches or workers map it."""
        try:
            self.close()
        except BufferError:
            pass
        try:
            self.unlink()
        except FileNotFoundError:
            pass


def _new_segment(nbytes):
    return Segment(name=f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}", create=True, size=nbytes)


def free_bytes(path=SHM_DIR):
    """Bytes free for unprivileged use under `path` (0 when it cannot be read)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _reserve(segment, nbytes):
    fd = os.open(os.path.join(SHM_DIR, segment.name.lstrip("/")), os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


_dtype = functools.lru_cache(maxsize=64)(np.dtype)  # layouts name dtypes by string; parse each once


class Ring:
    """`slots` slots of `slot_bytes` each in one shared-memory segment.

    Raises:
        OSError: with errno ENOSPC when `/dev/shm` cannot hold the whole ring.
    """

    def __init__(self, slots, slot_bytes):
        self.slots, self.slot_bytes = slots, slot_bytes
        self.segment = _new_segment(slots * slot_bytes)
        try:
            _reserve(self.segment, slots * slot_bytes)
        except OSError as e:
            self.segment.release()
            if e.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
                raise OSError(errno.ENOSPC, "no room in /dev/shm") from e
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without fallocate: carry on
                raise
            self.segment = _new_segment(slots * slot_bytes)
        self.name = self.segment.name
        self._free = collections.deque(range(slots))
        self._freed: collections.deque[weakref.ref[np.ndarray]] = collections.deque()  # dead exports, any thread
        self._exports: dict[int, weakref.ref[np.ndarray]] = {}  # slot -> weak reference to the batch's export array
        self._slot_of: dict[int, int] = {}  # id of a live export's weak reference -> its slot

    def acquire(self):
        """A free slot's index, or -1 when every slot is lent or held by live batches."""
        while self._freed:
            slot = self._slot_of.pop(id(self._freed.popleft()), None)
            if slot is not None:
                self._free.append(slot)
        try:
            return self._free.popleft()
        except IndexError:
            return -1

    def give_back(self, slot):
        """Returns a slot whose task sent nothing through it (an error, or a pickled batch)."""
        self._free.append(slot)

    def export(self, slot, layout):
        """Leaves of the batch written into `slot`, as views of one per-batch array (no copy)."""
        start = slot * self.slot_bytes
        holder = np.frombuffer(self.segment.buf, np.uint8, count=self.slot_bytes, offset=start)
        ref = weakref.ref(holder, self._freed.append)
        self._exports[slot] = ref  # keeps the reference (and so its id) alive until the slot is lent again
        self._slot_of[id(ref)] = slot
        leaves = []
        for dtype, shape, offset in layout:
            dtype = _dtype(dtype)
            # math.prod, not np.prod: this runs for every leaf of every batch, and np.prod costs microseconds.
            end = offset + math.prod(shape) * dtype.itemsize
            if end > self.slot_bytes:
                raise RuntimeError(f"a batch laid out to byte {end} came back in a shared-memory slot of "
                                   f"{self.slot_bytes} bytes; this is a bug in kfast, please report it")
            leaves.append(holder[offset:end].view(dtype).reshape(shape))
        return leaves

    def unlink(self):
        """Removes the segment's name; workers and batches that map it keep using it until they are done."""
        try:
            self.segment.unlink()
        except FileNotFoundError:
            pass

    def release(self):
        """Unlinks the segment and unmaps it here; batches handed out stay valid until they are freed."""
        self._exports.clear()
        self._slot_of.clear()
        self.segment.release()
