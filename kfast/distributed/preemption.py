"""Preemption: a signal (SIGTERM, or one the user names) stops training at the next step boundary on every
rank together, so that rank 0 can write a step checkpoint; a step that cannot finish in time ends the process
within a bound instead.

Spot VMs, Kubernetes and Slurm all announce the end with a signal and a grace period (30 s by default on
Kubernetes, a chosen signal some seconds or minutes ahead on Slurm, about 30 s to 2 min on spot VMs). The
signal may reach one rank and not another, and ranks notice it at different moments, so the ranks agree
between steps (`PreemptionWatch.agree`): with a `kfast.DistributedOptimizer` each rank's note rides inside
the gradients' allreduce, which every rank issues at every step anyway (no collective of its own, one step
later); with any other optimizer the notes are summed in one allreduce per step. A non-zero sum stops every
rank after that same step. The note is taken by the loaders' signal watcher
(`kfast.data._workers.interrupt`) the moment the signal arrives, from a thread of its own: when the main
thread is stuck (a batch that never comes, a peer gone), a timer started then ends the process after
`timeout` seconds, with the loaders closed and no half-written checkpoint, and says so.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from kfast.data._workers import interrupt
from kfast.data._workers import signals as loader_signals
from kfast.distributed import _horovod as distributed

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
    rank knows rank 0's checkpoint is whole, by ending the process at once with status 75.

    Why at once: horovodrun stops the other ranks with SIGTERM when one exits, so ranks that each took
    seconds to unwind (TensorFlow's shutdown) would be reported as killed, or cut rank 0's file short.
    """
    if distributed.size() == 1:
        raise stopped
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # horovodrun's SIGTERM for a peer's exit must not change the status
    distributed.broadcast_object(None, root_rank=0)  # rank 0 wrote its checkpoint before it got here
    loader_signals.clean_up()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESUMABLE_EXIT)


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
        self._previous: dict[int, Any] = {}
        self._note: _Note | None = None
        self._lock = threading.Lock()
        self._active = False
        self._sent = False  # this rank's note is in the optimizer's exchange

    def start(self) -> None:
        """Installs the handlers (from the main thread only; elsewhere there is nothing to catch with)."""
        if not self.signums or threading.current_thread() is not threading.main_thread():
            return
        interrupt.install()
        interrupt.listen(self._noted)
        for signum in self.signums:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        self._active = True

    def stop(self, redeliver: bool) -> None:
        """Puts the previous handlers back; with `redeliver`, a signal noted and not acted on is raised again,
        to mean what it meant before (training ended before a step boundary could act on it)."""
        self._active = False
        interrupt.unlisten(self._noted)
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.reached_boundary()
        note, self._note = self._note, None
        if redeliver and note is not None:
            signal.raise_signal(note.signum)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._active:
            self._noted(signum)
            return
        # Outside fit (it ended in an error, say): the signal means what it meant before.
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.stop(redeliver=False)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _noted(self, signum: int) -> None:
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
        sys.stderr.write(f"\n{name}: kfast could not finish the current training step within {self.timeout:g} s of "
                         f"the signal (a batch or a peer rank is stuck), so it ends without a step checkpoint, exit "
                         f"status {status}; {self.describe}\n")
        sys.stderr.flush()
        try:
            self.on_expire()
            loader_signals.clean_up()
        finally:
            os._exit(status)

    def requested(self) -> int | None:
        """The signal noted on this rank, or None."""
        note = self._note
        return note.signum if note else None

    def agree(self, optimizer: Any = None) -> str | None:
        """Called by every rank between every two steps: the name of the signal that stops them all now, or None.

        With a `kfast.DistributedOptimizer`, the notes travel inside the gradients' allreduce (no collective
        of its own: one step later, but free); otherwise they are summed in an allreduce here.
        """
        mine = self.requested()
        if distributed.size() > 1:
            if getattr(optimizer, "carries_stop", lambda: False)():
                if mine and not self._sent:
                    optimizer.note_stop()
                    self._sent = True
                if not optimizer.stop_agreed():
                    return None
            elif not distributed.allreduce_sum_values([1.0 if mine else 0.0])[0]:
                return None
        elif not mine:
            return None
        return signal.Signals(mine).name if mine else "a signal on another rank"

    def reached_boundary(self) -> None:
        """The step finished: the bound no longer applies (the checkpoint is written next)."""
        note = self._note
        if note is not None:
            note.timer.cancel()
