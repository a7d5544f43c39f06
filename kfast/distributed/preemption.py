"""Preemption: a signal (SIGTERM, or one the user names) stops training at the next step boundary on every
rank together, so that rank 0 can write a step checkpoint; a step that cannot finish in time ends the process
within a bound instead.

Spot VMs, Kubernetes and Slurm all announce the end with a signal and a grace period (30 s by default on
Kubernetes, a chosen signal some seconds or minutes ahead on Slurm, about 30 s to 2 min on spot VMs). The
signal may reach one rank and not another, and ranks notice it at different moments, so the ranks agree
between steps (`PreemptionWatch.agree`): with a `kfast.DistributedOptimizer` under Horovod each rank's note
rides inside the gradients' allreduce, which every rank issues at every step anyway (no collective of its own,
one step later); otherwise (any other optimizer, or the JAX engine) the ranks vote in one small collective per
step, on either engine (NOTE [ The vote ]). A note on any rank stops every rank after that same step. The
signals are caught through `kfast._core.signal_handling`, which owns every handler kfast installs: the note is
taken the moment the signal arrives, from a thread of its own, so that when the main thread is stuck (a batch
that never comes, a peer gone), a timer started then ends the process after `timeout` seconds, with the
loaders closed and no half-written checkpoint, and says so.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from kfast._core import signal_handling
from kfast.distributed import collectives

# The exit status of a run stopped by preemption after its step checkpoint was written: EX_TEMPFAIL of
# sysexits.h, "a temporary failure; the user is invited to retry". A scheduler requeues on it.
RESUMABLE_EXIT = 75


class Preempted(SystemExit):
    """Training stopped for a preemption signal and its step checkpoint is written: resume with `restore()`.

    A `SystemExit` with status 75 (`kfast.distributed.RESUMABLE_EXIT`): in a single process, left uncaught,
    the script ends with that status (a notebook shows it and goes on). Under Horovod every rank instead
    ends at once with status 75 as soon as rank 0's checkpoint is written (see `leave`).

    Attributes:
        signal_name: the signal that stopped it ("SIGTERM"), or "a signal on another rank".
        path: the checkpoint written.
        epoch: the epoch (from 0) it stopped in.
        batch: batches of that epoch trained.
    """

    def __init__(self, signal_name: str, path: str, epoch: int, batch: int) -> None:
        super().__init__(RESUMABLE_EXIT)
        self.signal_name, self.path, self.epoch, self.batch = signal_name, path, epoch, batch

    def __str__(self) -> str:
        where = f"after batch {self.batch} of epoch {self.epoch + 1}" if self.batch else \
            f"at the start of epoch {self.epoch + 1}"
        return (f"stopped by {self.signal_name} {where}; the checkpoint is {self.path}; resume with "
                f"kfast.distributed.restore(model, directory) (exit status {RESUMABLE_EXIT})")


def signal_numbers(owner: str, names: Sequence[str | int] | None) -> tuple[int, ...]:
    """The signal numbers of `names` ("SIGTERM", "SIGUSR1", 15, ...).

    Raises:
        ValueError: for a name that is not a signal this system has, or SIGINT/SIGKILL/SIGSTOP.
    """
    if names is None:
        return ()
    if isinstance(names, (str, int)):
        names = [names]
    out = []
    for name in names:
        try:
            number = signal.Signals[name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()] \
                if isinstance(name, str) else signal.Signals(name)
        except (KeyError, ValueError):
            raise ValueError(f"{owner} got the signal {name!r}, which this system does not have; name signals as "
                             "'SIGTERM' or 'SIGUSR1' (Slurm's --signal=B:USR1@120).") from None
        if number in (signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"{owner} got {number.name}: SIGKILL and SIGSTOP cannot be caught, and Ctrl-C (SIGINT) "
                             "keeps its own meaning (it interrupts at once); pass SIGTERM or SIGUSR1.")
        out.append(int(number))
    return tuple(dict.fromkeys(out))


def leave(stopped: Preempted) -> None:
    """Ends training for `stopped`, its checkpoint written: alone, by raising it; under Horovod, once every
    rank knows rank 0's checkpoint is whole, by ending every process together, at once, with status 75.

    Why at once: horovodrun stops the other ranks with SIGTERM when one exits, so ranks that each took
    seconds to unwind (TensorFlow's shutdown) would be reported as killed, or cut rank 0's file short.
    """
    if collectives.size() == 1:
        raise stopped
    signal_handling.ignore_terminations()  # horovodrun's SIGTERM for a peer's exit must not change the status
    collectives.broadcast_object(None, root_rank=0)  # rank 0 wrote its checkpoint before it got here
    # After the clean-ups, a last meeting: horovodrun reports the first rank to end and stops the others
    # through their shells, so a rank ending tens of ms after it (a slower clean-up) was listed as 143.
    signal_handling.end(RESUMABLE_EXIT, "", last=lambda: collectives.broadcast_object(None, root_rank=0))


# NOTE [ The vote ]
# Each rank hands three ints to one element-wise maximum (`collectives.allreduce_max_ints`): the number of the
# signal it noted (0 for none), and its count of votes so far and that count negated. The first maximum names
# the signal that stops every rank; the other two are the largest and (negated) the smallest count, which differ
# only when the ranks vote at different steps: a rank that skipped a step would pair its collectives with
# another step's, so that is an error on every rank alike, not a stop at some step.


@dataclasses.dataclass
class _Note:
    signum: int
    timer: threading.Timer


class PreemptionWatch:
    """Notes the preemption signals during one `fit` and agrees with the other ranks when to stop.

    Args:
        signums: the signals that preempt.
        timeout: seconds from the signal to the end of the current step; past them the process ends.
        on_expire: called (from a timer thread) just before the process ends that way, to free what it holds.
        describe: what the end-of-process message says of where checkpoints are kept.
    """

    def __init__(self, signums: tuple[int, ...], timeout: float, on_expire: Callable[[], None],
                 describe: str) -> None:
        self.signums, self.timeout, self.on_expire, self.describe = signums, timeout, on_expire, describe
        self._catch: signal_handling.Catch | None = None
        self._note: _Note | None = None
        self._lock = threading.Lock()
        self._active = False
        self._sent = False  # this rank's note is in the optimizer's exchange
        self._votes = 0  # the votes this rank took part in (NOTE [ The vote ])

    def start(self) -> None:
        """Catches the signals (from the main thread only; elsewhere there is nothing to catch with)."""
        if self.signums and self._catch is None:
            self._active = True
            self._catch = signal_handling.catch(self.signums, self._noted)
            self._active = self._catch is not None

    def stop(self, redeliver: bool) -> None:
        """Lets the signals mean what they meant before; with `redeliver`, a signal noted and not acted on is
        raised again, to mean that (training ended before a step boundary could act on it)."""
        self._active = False
        catch, self._catch = self._catch, None
        if catch is not None:
            catch.release()
        self.reached_boundary()
        note, self._note = self._note, None
        if redeliver and note is not None:
            signal.raise_signal(note.signum)

    def _noted(self, signum: int) -> None:
        # Called from the signal watch's thread as the signal arrives, and again from the main thread's handler.
        if signum not in self.signums or not self._active:
            return
        with self._lock:
            if self._note is None:
                timer = threading.Timer(self.timeout, self._expire)
                timer.daemon = True
                self._note = _Note(signum, timer)
                timer.start()

    def _expire(self) -> None:
        note = self._note
        name = signal.Signals(note.signum).name if note else "the signal"
        status = 128 + (note.signum if note else signal.SIGTERM)
        message = (f"\n{name}: kfast could not finish the current training step within {self.timeout:g} s of the "
                   f"signal (a batch or a peer rank is stuck), so it ends without a step checkpoint, exit status "
                   f"{status}; {self.describe}\n")
        sys.stderr.write(message)
        sys.stderr.flush()
        try:
            self.on_expire()
        finally:
            signal_handling.end(status, "")

    def requested(self) -> int | None:
        """The signal noted on this rank, or None."""
        note = self._note
        return note.signum if note else None

    def agree(self, optimizer: Any = None) -> str | None:
        """Called by every rank between every two steps: the name of the signal that stops them all now, or None.

        With a `kfast.DistributedOptimizer` under Horovod, the notes travel inside the gradients' allreduce (no
        collective of its own: one step later, but free); otherwise the ranks vote (NOTE [ The vote ]).

        Raises:
            RuntimeError: on every rank, when the ranks voted at different steps.
        """
        mine = self.requested()
        if collectives.size() == 1:
            return signal.Signals(mine).name if mine else None
        if getattr(optimizer, "carries_stop", lambda: False)():
            if mine and not self._sent:
                optimizer.note_stop()
                self._sent = True
            if not optimizer.stop_agreed():
                return None
            return signal.Signals(mine).name if mine else "a signal on another rank"
        self._votes += 1
        agreed, most, fewest = collectives.allreduce_max_ints([mine or 0, self._votes, -self._votes])
        if most != -fewest:
            raise RuntimeError(f"kfast's preemption vote found the ranks at different steps of this fit (vote "
                               f"{-fewest} to {most}; this rank's is {self._votes}): every rank must run the same "
                               "steps. Give every rank the same number of batches (kfast.data.FastLoader with "
                               "training=True shards them evenly).")
        if not agreed:
            return None
        return signal.Signals(mine).name if mine else f"{signal.Signals(agreed).name} on another rank"

    def reached_boundary(self) -> None:
        """The step finished: the bound no longer applies (the checkpoint is written next)."""
        note = self._note
        if note is not None:
            note.timer.cancel()
