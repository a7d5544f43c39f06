"""Running the launcher's command (horovodrun) with TensorFlow's start-up lines filtered from its stderr, and
the stop signals this process receives passed on to it.

The signals go through kfast's one signal owner (`kfast._core.signal_handling.catch`), which tells a catcher
of each signal twice (from its watch thread as it arrives, and from the main thread's handler): one arrival
of a signal is passed on once, so a Ctrl-C reaches horovodrun as one Ctrl-C.

NOTE [ Passing a signal on a second late ]
A terminal's Ctrl-C and Slurm's scancel signal every process of the job, horovodrun too; `kill PID` or a
container runtime signals this process alone. Both must stop the job, so the signal is passed on either way,
but not at once: horovodrun's handler sets a `threading.Event` under a lock that is not re-entrant, and a
second SIGTERM arriving while that handler runs (ours, a few ms after the scheduler's) deadlocks it, so
scancel's job hung until Slurm's SIGKILL 30 s later. `_PASS_ON_AFTER_S` later the first handler is long done.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence

from kfast._core import signal_handling
from kfast._core import tf_noise

PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The watch thread's and the handler's calls for one arrival come within a few ms of each other; a person
# pressing Ctrl-C again takes longer than this.
_SAME_ARRIVAL_S = 0.25
# See the NOTE: a handler that sets an Event takes microseconds; a second is also short enough for a person.
_PASS_ON_AFTER_S = 1.0


class Arrivals:
    """Tells a second call for the same signal within `_SAME_ARRIVAL_S` from a new arrival."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, float] = {}

    def new(self, signum: int) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(signum)
            self._last[signum] = now
            return last is None or now - last > _SAME_ARRIVAL_S


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for a child ended by signal N (Popen's -N).

    Example:

    >>> exit_status(-15), exit_status(75)
    (143, 75)
    """
    return 128 - returncode if returncode < 0 else returncode


def run(cmd: Sequence[str], cwd: str | None = None, stop_grace_s: float = 30,
        watch: Callable[[bytes], None] | None = None,
        handlers: Mapping[int, Callable[[int], None]] | None = None) -> int:
    """Runs `cmd` with its stderr filtered through `tf_noise.copy` and returns its exit status (128+N for
    signal N).

    SIGINT, SIGTERM and SIGHUP sent to this process are passed on to `cmd` a second later (horovodrun stops
    its ranks on them; see the NOTE at the top), and this process waits for it; if it is still running
    `stop_grace_s` seconds after such a signal, it is killed. When the command ends, the signals mean what they meant before.

    Args:
        cmd: the command line.
        cwd: its working directory.
        stop_grace_s: how long it may run on after a stop signal.
        watch: sees each line of its stderr (bytes, with the newline).
        handlers: {signal number: handler(pid of cmd)}, each called once per arrival of its signal instead
            of passing it on.

    Returns:
        The command's exit status.
    """
    proc = subprocess.Popen(list(cmd), cwd=cwd, stderr=subprocess.PIPE)
    forward = threading.Thread(target=tf_noise.copy, args=(proc.stderr, sys.stderr.buffer, watch),
                               name="kfast-stderr", daemon=True)
    forward.start()
    own = dict(handlers or {})
    arrivals = Arrivals()
    passed_on: list[float] = []  # when the first signal to pass on arrived: the grace period starts then
    timers: list[threading.Timer] = []

    def pass_on(signum: int) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    def caught(signum: int) -> None:
        if not arrivals.new(signum):
            return
        if signum in own:
            own[signum](proc.pid)
        elif proc.poll() is None:
            passed_on.append(time.monotonic())
            timer = threading.Timer(_PASS_ON_AFTER_S, pass_on, args=(signum,))
            timer.daemon = True
            timers.append(timer)
            timer.start()

    taken = signal_handling.catch((*PASSED_ON, *own), caught)
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if passed_on and time.monotonic() - passed_on[0] > stop_grace_s:
                    proc.kill()
    finally:
        if taken is not None:
            taken.release()
        for timer in timers:
            timer.cancel()
    forward.join(timeout=5)
    return exit_status(code)
