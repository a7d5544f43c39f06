"""Starts the JAX processes of a `kfast launch` job on this host and watches them, as horovodrun does its ranks.

`python -m kfast.cluster.jax_processes -np N -- python train.py ...` runs N copies of the command, each told
the job by Keras's variables (the coordinator's address, the process count, its id) and kfast's (its local
rank and the local count), with `KERAS_BACKEND=jax`. With `-H host1:2,host2:2` it starts the processes on those
hosts instead (`kfast.cluster.jax_hosts`: one of these starters per host, over ssh). `kfast launch` runs it in
horovodrun's place, so the job's signal and status rules are the same for both engines (`kfast.cluster.job`,
and `kfast.cluster.process_group` for stop signals, failures and the status):

- Each line a process prints comes out whole, after its process id (`[1] ...`), as horovodrun's `[1,0]<stdout>:`.
- It exits with the first failed process's status (75 for a resumable stop) and says which, in horovodrun's
  words (`Exit code: N`), which `kfast.cluster.job` reads.

A per-host starter (`--coordinator`, `--count`, `--first-id`, `--control-stdin`: what `jax_hosts` passes) runs
its share of a larger job, and takes signal names, one per line, on its standard input from the launcher (ssh
carries no signals); the end of its input means the launcher is gone, and its processes are stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO

from kfast.cluster import jax_hosts, process_group
from kfast.cluster.process_group import free_port
from kfast.distributed import _jax
from kfast.env import preflight

# A resumable stop writes rank 0's checkpoint first: the others wait at its barrier and leave right after.
PEERS_GRACE_S = 30.0


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


def _read_control(control: IO[str], forward: Callable[[int], None]) -> None:
    """Forwards each signal named on `control` (`SIGTERM` lines); at its end (the launcher or its ssh is gone),
    stops the processes: SIGTERM now (a checkpoint, where the job takes one), SIGKILL after a while."""
    for line in iter(control.readline, ""):
        name = line.strip()
        if name in signal.Signals.__members__:
            forward(signal.Signals[name])
    forward(signal.SIGTERM)
    last = threading.Timer(PEERS_GRACE_S + process_group.KILL_AFTER_S, forward, args=(signal.SIGKILL,))
    last.daemon = True
    last.start()


def run(np: int, cmd: Sequence[str], grace_s: float = PEERS_GRACE_S, *, coordinator: str | None = None,
        count: int | None = None, first_id: int = 0, control: IO[str] | None = None) -> int:
    """Runs `np` processes of `cmd` on this host and returns the job's exit status (see the module's notes).

    Args:
        np: the processes to start here.
        cmd: what each runs.
        grace_s: how long the others may run on once one failed, before SIGTERM (and SIGKILL
            `process_group.KILL_AFTER_S` later).
        coordinator: `host:port` of process 0's coordinator; default: a free port on 127.0.0.1 (a job on
            this host alone).
        count: the processes of the whole job (default `np`); these are `first_id` to `first_id + np - 1`.
        first_id: the id of the first process started here.
        control: signal names, one per line; see the module's notes.
    """
    count = np if count is None else count
    coordinator = coordinator or f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen(list(cmd), env=process_env(dict(os.environ), coordinator, count, first_id + i, i, np),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(np)]
    lock = threading.Lock()
    copies = [threading.Thread(target=process_group.copy_lines, daemon=True,
                               args=(stream, sink, f"[{first_id + i}] ".encode(), lock))
              for i, p in enumerate(procs) for stream, sink in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer))]
    for thread in copies:
        thread.start()

    def listen(forward: Callable[[int], None]) -> None:
        if control is not None:
            threading.Thread(target=_read_control, args=(control, forward), daemon=True).start()

    first = process_group.watch(procs, grace_s, on_start=listen)
    for thread in copies:
        thread.join(timeout=5)  # the last lines of every process before the verdict
    if first is None:
        return 0
    index, status = first
    if control is None:  # a per-host starter's launcher gives the job's verdict
        print(f"kfast: JAX process {first_id + index} of {count} ended first, with status {status}.\n"
              f"Exit code: {status}", file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kfast.cluster.jax_processes",
                                     description="Start N JAX processes of a command on this host or on the hosts "
                                                 "of -H (kfast launch).")
    parser.add_argument("-np", type=int, required=True, help="how many processes (here, or on all hosts of -H)")
    parser.add_argument("-H", dest="hosts", help="host:slots[,host:slots...]: start the processes there, over ssh "
                                                 "for other hosts (default: all on this host)")
    parser.add_argument("--chdir", metavar="DIR", help="with -H: where the processes run on every host "
                                                       "(default: this directory)")
    parser.add_argument("--grace", type=float, default=PEERS_GRACE_S, metavar="SECONDS",
                        help=f"how long the others may run on once one failed (default {PEERS_GRACE_S:g})")
    parser.add_argument("--coordinator", help="a per-host starter's: process 0's host:port")
    parser.add_argument("--count", type=int, help="a per-host starter's: the processes of the whole job")
    parser.add_argument("--first-id", type=int, default=0, help="a per-host starter's: its first process id")
    parser.add_argument("--control-stdin", action="store_true",
                        help="a per-host starter's: read signal names from standard input (see the module)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every process runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.np < 1 or not cmd:
        parser.error("give -np N (at least 1) and, after --, the command")
    if args.hosts:
        try:
            groups = jax_hosts.groups(args.np, args.hosts)
        except ValueError as e:
            parser.error(str(e))
        if len(groups) > 1 or not preflight.is_local(groups[0].host):
            return jax_hosts.run(groups, cmd, directory=os.path.abspath(args.chdir or os.getcwd()), grace_s=args.grace)
    if args.chdir:
        os.chdir(args.chdir)
    return run(args.np, cmd, grace_s=args.grace, coordinator=args.coordinator, count=args.count,
               first_id=args.first_id, control=sys.stdin if args.control_stdin else None)


if __name__ == "__main__":
    sys.exit(main())
