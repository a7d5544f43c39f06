"""Watches a group of child processes as one job: the JAX engine's starter runs its processes through it, and
its multi-host starter the per-host starters it runs over ssh.

The rules (the same as horovodrun's for its ranks):
- SIGINT, SIGTERM and SIGHUP that reach the watcher reach every member (a member may pass them on further).
- When a member fails, the others get `grace_s` to end on their own (a preemption ends every process with 75
  within moments of each other), then `terminate()`, then `kill()` `KILL_AFTER_S` later: a dead process never
  leaves the rest waiting in a collective for ever.
- The job's status is the first failed member's (75 for a resumable stop).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Protocol

from kfast._core import signal_handling
from kfast.cluster import filtered_run

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_AFTER_S = 10.0


class Member(Protocol):
    """What the watcher needs of a member: `subprocess.Popen`'s methods of these names."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def free_port() -> int:
    """A TCP port free on this host now (bound on all its addresses, as a coordinator binds)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def copy_lines(stream: IO[bytes], sink: IO[bytes], prefix: bytes, lock: threading.Lock) -> None:
    """Copies `stream` to `sink` line by line, each whole and after `prefix`, until `stream` ends."""
    for line in iter(stream.readline, b""):
        with lock:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


def watch(members: Sequence[Member], grace_s: float,
          on_start: Callable[[Callable[[int], None]], None] | None = None) -> tuple[int, int] | None:
    """Waits until every member ended (see the module's rules); returns `(index, status)` of the first that
    failed, or None when all ended with 0. Members still running when this is interrupted are killed.

    `on_start`, when given, is called with the signal forwarder once this starts (the per-host starter hands it
    to the thread that reads the signals its launcher sends over ssh).
    """
    arrivals = filtered_run.Arrivals()

    def forward(signum: int) -> None:
        if not arrivals.new(signum):
            return  # the signal owner tells of one arrival twice
        for m in members:
            if m.poll() is None:
                m.send_signal(signum)

    taken = signal_handling.catch(FORWARDED, forward)
    if on_start is not None:
        on_start(forward)
    first: tuple[int, int] | None = None
    failed_at = 0.0
    try:
        while any(m.poll() is None for m in members):
            for i, m in enumerate(members):
                code = m.poll()
                if first is None and code not in (None, 0):
                    first, failed_at = (i, filtered_run.exit_status(code)), time.monotonic()
            if first is not None:
                waited = time.monotonic() - failed_at
                for m in members:
                    if m.poll() is None and waited > grace_s + KILL_AFTER_S:
                        m.kill()
                    elif m.poll() is None and waited > grace_s:
                        m.terminate()
            time.sleep(0.1)
    finally:
        if taken is not None:
            taken.release()
        for m in members:  # an exception here (a Ctrl-C between the checks) leaves no process behind
            if m.poll() is None:
                m.kill()
                m.wait(timeout=KILL_AFTER_S + 5)
    if first is None:
        # A failure in the last moments, after the loop's final look.
        bad = [(i, filtered_run.exit_status(m.returncode)) for i, m in enumerate(members)
               if m.returncode not in (None, 0)]
        first = bad[0] if bad else None
    return first
