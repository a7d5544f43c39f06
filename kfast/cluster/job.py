"""Running the horovodrun job `kfast launch` built: a scheduler's stop signal passed to the ranks, the
resumable status (75) kept, and a Slurm job requeued after it.

horovodrun ends with status 1 whatever its ranks' statuses were, and says which rank ended first, with
what, in its last lines on stderr ("Exit code: 75"). A rank exits 75 only after every rank reached the
preemption barrier, that is after rank 0's checkpoint file was complete (kfast.distributed.preemption),
so one 75 there means the whole job stopped resumably.

Slurm's `--signal=B:USR1@120` signals only the batch shell (`exec kfast launch ...` makes that this
process). The ranks watch SIGTERM (RankZeroCheckpoint's default), so this process sends SIGTERM to the
ranks on its own host; they agree with the others at the next step (the note rides in the gradients'
allreduce), and all stop after that step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from kfast.cluster import filtered_run
from kfast.distributed.preemption import RESUMABLE_EXIT

_FIRST_EXIT = re.compile(rb"Exit code: (-?\d+)\s*")


@dataclass
class JobEnd:
    """How the job ended.

    Attributes:
        status: this process's exit status: 75 when the ranks stopped resumably, else horovodrun's.
        stop_signal: the stop signal received (its name), or None.
        first_exit: the exit status of the rank horovodrun saw end first, when one failed.
        requeued: True when the Slurm job was requeued.
    """

    status: int
    stop_signal: str | None = None
    first_exit: int | None = None
    requeued: bool = False


def local_ranks(launcher_pid: int, rank_cmd: Sequence[str]) -> list[int]:
    """Pids of the rank processes horovodrun started on this host: its descendants running `rank_cmd`
    (compared without the interpreter, which horovodrun may start through `env` or a shell)."""
    import psutil

    tail = list(rank_cmd[1:])
    found = []
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if len(cmd) > len(tail) and cmd[1:1 + len(tail)] == tail and "python" in os.path.basename(cmd[0]):
            found.append(child.pid)
    return found


def requeue(job_id: str) -> str | None:
    """Asks Slurm to requeue job `job_id`; returns None, or why it could not."""
    try:
        proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"scontrol exited {proc.returncode}")


def run(cmd: Sequence[str], rank_cmd: Sequence[str], *, cwd: str, stop_signals: Sequence[int] = (),
        requeue_job: str | None = None) -> JobEnd:
    """Runs horovodrun's `cmd`; on a stop signal, sends SIGTERM to the local ranks; requeues on status 75.

    Args:
        cmd: the horovodrun command.
        rank_cmd: the command every rank runs (to find this host's ranks).
        cwd: where horovodrun runs.
        stop_signals: signals that mean "stop with a checkpoint" (e.g. Slurm's USR1).
        requeue_job: a Slurm job id to requeue when the job stopped resumably after a stop signal.

    Returns:
        How it ended.
    """
    end = JobEnd(status=0)
    first: list[int] = []

    def watch(line: bytes) -> None:
        match = _FIRST_EXIT.fullmatch(line)
        if match:
            first.append(int(match.group(1)))

    def stop(signum: int, launcher_pid: int) -> None:
        name = signal.Signals(signum).name
        ranks = local_ranks(launcher_pid, rank_cmd)
        if end.stop_signal is None:
            end.stop_signal = name
            print(f"kfast launch: {name} received; sending SIGTERM to the {len(ranks)} rank(s) on this host, "
                  "so every rank stops after the next step with a checkpoint", file=sys.stderr, flush=True)
            if not ranks:
                print("kfast launch: no rank runs on this host, so the signal reaches none; run kfast launch on "
                      "one of the job's hosts", file=sys.stderr, flush=True)
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    handlers = {s: (lambda pid, s=s: stop(s, pid)) for s in stop_signals}
    code = filtered_run.run(cmd, cwd=cwd, watch=watch, handlers=handlers)
    end.first_exit = first[-1] if first else None
    end.status = RESUMABLE_EXIT if code != 0 and end.first_exit == RESUMABLE_EXIT else code
    if end.status == RESUMABLE_EXIT and end.stop_signal and requeue_job:
        # Said before asking: a requeue that works kills this batch script, often before a line after it is out.
        print(f"kfast launch: the ranks stopped with a checkpoint (status {RESUMABLE_EXIT}); requeueing Slurm job "
              f"{requeue_job}: it resumes where it stopped", file=sys.stderr, flush=True)
        why = requeue(requeue_job)
        end.requeued = why is None
        if why is not None:
            print(f"kfast launch: requeueing Slurm job {requeue_job} failed ({why}); resubmit it to resume",
                  file=sys.stderr, flush=True)
    elif end.status == RESUMABLE_EXIT:
        print(f"kfast launch: the ranks stopped with a checkpoint (status {RESUMABLE_EXIT}); run the same command "
              "with --resume to continue", file=sys.stderr, flush=True)
    return end
