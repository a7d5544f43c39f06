"""Starts the JAX processes of a `kfast launch` job on this host and watches them, as horovodrun does its ranks.

`python -m kfast.cluster.jax_processes -np N -- python train.py ...` runs N copies of the command, each told
the job by Keras's variables (the coordinator's address, the process count, its id) and kfast's (its local
rank and the local count), with `KERAS_BACKEND=jax`. `kfast launch` runs it in horovodrun's place, so the
job's signal and status rules are the same for both engines (`kfast.cluster.job`):

- SIGINT, SIGTERM and SIGHUP reach every process (their preemption handler stops them all after the same step).
- When a process fails, the others get `_PEERS_GRACE_S` to end on their own (a preemption ends every process
  with 75 within moments of each other), then SIGTERM, then SIGKILL: a dead process never leaves the rest
  waiting in a collective for ever.
- Each line a process prints comes out whole, after its process id (`[1] ...`), as horovodrun's `[1,0]<stdout>:`.
- It exits with the first failed process's status (75 for a resumable stop) and says which, in horovodrun's
  words (`Exit code: N`), which `kfast.cluster.job` reads.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from kfast._core import signal_handling
from kfast.cluster import filtered_run
from kfast.distributed import _jax

# A resumable stop writes rank 0's checkpoint first: the others wait at its barrier and leave right after.
_PEERS_GRACE_S = 30.0
_KILL_AFTER_S = 10.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_env(base: dict[str, str], coordinator: str, count: int, process_id: int, local_rank: int,
                local_size: int) -> dict[str, str]:
    """The environment of process `process_id` of `count`: Keras's distribution variables and kfast's local ones.

    Example:

    >>> env = process_env({}, "127.0.0.1:1234", 2, 1, 1, 2)
    >>> env["KERAS_DISTRIBUTION_PROCESS_ID"], env["KFAST_LOCAL_RANK"], env["KERAS_BACKEND"]
    ('1', '1', 'jax')
    """
    env = dict(base)
    env.update({_jax.ADDRESS_VAR: coordinator, _jax.COUNT_VAR: str(count), _jax.ID_VAR: str(process_id),
                _jax.LOCAL_RANK_VAR: str(local_rank), _jax.LOCAL_SIZE_VAR: str(local_size), "KERAS_BACKEND": "jax"})
    return env


def _copy_lines(stream: IO[bytes], sink: IO[bytes], prefix: bytes, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


def run(np: int, cmd: Sequence[str], grace_s: float = _PEERS_GRACE_S) -> int:
    """Runs `np` processes of `cmd` on this host and returns the job's exit status (see the module's notes).

    `grace_s`: how long the others may run on once one failed, before SIGTERM (and SIGKILL `_KILL_AFTER_S` later).
    """
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen(list(cmd), env=process_env(dict(os.environ), coordinator, np, i, i, np),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(np)]
    lock = threading.Lock()
    copies = [threading.Thread(target=_copy_lines, args=(stream, sink, f"[{i}] ".encode(), lock), daemon=True)
              for i, p in enumerate(procs) for stream, sink in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer))]
    for thread in copies:
        thread.start()
    arrivals = filtered_run.Arrivals()

    def forward(signum: int) -> None:
        if not arrivals.new(signum):
            return  # the signal owner tells of one arrival twice
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    taken = signal_handling.catch(_FORWARDED, forward)
    first: tuple[int, int] | None = None  # (process id, status) of the first to fail
    failed_at = 0.0
    try:
        while any(p.poll() is None for p in procs):
            for i, p in enumerate(procs):
                code = p.poll()
                if first is None and code not in (None, 0):
                    first, failed_at = (i, filtered_run.exit_status(code)), time.monotonic()
            if first is not None:
                waited = time.monotonic() - failed_at
                for p in procs:
                    if p.poll() is None and waited > grace_s + _KILL_AFTER_S:
                        p.kill()
                    elif p.poll() is None and waited > grace_s:
                        p.terminate()
            time.sleep(0.1)
    finally:
        if taken is not None:
            taken.release()
        for p in procs:  # an exception here (a Ctrl-C between the checks) leaves no process behind
            if p.poll() is None:
                p.kill()
                p.wait()
    for thread in copies:
        thread.join(timeout=5)  # the last lines of every process before the verdict
    if first is None:
        # A failure in the last moments, after the loop's final look.
        bad = [(i, filtered_run.exit_status(p.returncode)) for i, p in enumerate(procs) if p.returncode != 0]
        if not bad:
            return 0
        first = bad[0]
    process_id, status = first
    print(f"kfast: JAX process {process_id} of {np} ended first, with status {status}.\nExit code: {status}",
          file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kfast.cluster.jax_processes",
                                     description="Start N JAX processes of a command on this host (kfast launch).")
    parser.add_argument("-np", type=int, required=True, help="how many processes")
    parser.add_argument("--grace", type=float, default=_PEERS_GRACE_S, metavar="SECONDS",
                        help=f"how long the others may run on once one failed (default {_PEERS_GRACE_S:g})")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every process runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.np < 1 or not cmd:
        parser.error("give -np N (at least 1) and, after --, the command")
    return run(args.np, cmd, grace_s=args.grace)


if __name__ == "__main__":
    sys.exit(main())
