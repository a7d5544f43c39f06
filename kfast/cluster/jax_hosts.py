"""Starts a JAX engine job on several hosts: one per-host starter (`kfast.cluster.jax_processes`) on each, over
ssh for the others, as horovodrun starts its ranks (the same Python at the same path everywhere, password-less
ssh from this host).

Process 0 runs on the first host of `-H` and hosts the job's coordinator, at that host's name as given (every
host must resolve it) and a port free on this host when the job starts. Each host's processes get the ids
that follow the previous host's, and local ranks from 0. Variables that shape the run travel with the command
(`FORWARDED_PREFIXES`, `FORWARDED_NAMES`: ssh passes none).

ssh carries no signals, so this starter sends each signal it gets as a line (`SIGTERM`) on every per-host
starter's standard input; closing it (this starter ends, or is killed) stops that host's processes. A failed
host ends the job as a failed process does on one host (`kfast.cluster.process_group`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kfast.cluster import process_group
from kfast.cluster.hosts import parse_host_list
from kfast.env import preflight

FORWARDED_PREFIXES = ("KERAS_", "KFAST_", "JAX_", "XLA_", "TF_", "CUDA_", "NCCL_", "OMP_", "PYTHON")
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
_SSH_STATUS = 255  # ssh's own status: the host was not reached, or refused the command


@dataclass(frozen=True)
class HostGroup:
    """The processes one host runs: `count` of them, ids `first_id` to `first_id + count - 1`."""

    host: str
    count: int
    first_id: int


def groups(np: int, hosts: str) -> list[HostGroup]:
    """Lays `np` processes over `hosts` (`host:slots,...`), filling each host's slots in order.

    Example:

    >>> groups(3, "hostA:2,hostB:2")
    [HostGroup(host='hostA', count=2, first_id=0), HostGroup(host='hostB', count=1, first_id=2)]

    Raises:
        ValueError: for a malformed list, too few slots, or a loopback name as the coordinator's host of a job
            that spans hosts.
    """
    found, first_id = [], 0
    for host, slots in parse_host_list(hosts, np).hosts:
        count = min(slots, np - first_id)
        if count > 0:
            found.append(HostGroup(host, count, first_id))
            first_id += count
    if len(found) > 1 and (found[0].host == "localhost" or found[0].host.startswith("127.")):
        raise ValueError(f"-H {hosts}: the first host runs process 0 and the coordinator, which the other hosts "
                         f"reach by that name, and {found[0].host!r} names each host itself; name this host as the "
                         "others know it.")
    return found


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that travel to the other hosts (see the module's notes)."""
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES}


def host_command(group: HostGroup, count: int, coordinator: str, cmd: Sequence[str], directory: str,
                 env: Mapping[str, str], grace_s: float, python: str = sys.executable) -> list[str]:
    """The command that starts `group`'s processes: the per-host starter, through ssh for another host."""
    starter = [python, "-m", "kfast.cluster.jax_processes", "-np", str(group.count), "--coordinator", coordinator,
               "--count", str(count), "--first-id", str(group.first_id), "--grace", f"{grace_s:g}",
               "--control-stdin", "--", *cmd]
    if preflight.is_local(group.host):
        return starter
    variables = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(forwarded_env(env).items()))
    remote = f"cd {shlex.quote(directory)} && exec env {variables} {shlex.join(starter)}"
    return ["ssh", *preflight.SSH_OPTIONS, group.host, remote]


class _Starter:
    """A per-host starter as a `process_group.Member`: its signals go as lines on its standard input."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self._closed_at: float | None = None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        stdin = self.popen.stdin
        if self._closed_at is not None or stdin is None:
            return
        try:
            stdin.write(f"{signal.Signals(sig).name}\n".encode())
            stdin.flush()
        except (OSError, ValueError):
            pass  # it is ending: its processes stop with it

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Closes its input, which stops its processes; ends the starter (or its ssh) if that did not, later."""
        if self._closed_at is None:
            self._closed_at = time.monotonic()
            if self.popen.stdin is not None:
                try:
                    self.popen.stdin.close()
                except OSError:
                    pass
        elif time.monotonic() - self._closed_at > process_group.KILL_AFTER_S + 5:
            self.popen.kill()

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


def run(groups: Sequence[HostGroup], cmd: Sequence[str], directory: str,
        grace_s: float = 30.0, env: Mapping[str, str] | None = None) -> int:
    """Runs the job's processes on `groups`' hosts and returns its exit status (the first failed host's)."""
    env = dict(os.environ if env is None else env)
    count = sum(g.count for g in groups)
    coordinator = f"{groups[0].host}:{process_group.free_port()}"
    starters = [_Starter(subprocess.Popen(host_command(g, count, coordinator, cmd, directory, env, grace_s),
                                          cwd=directory, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
                for g in groups]
    lock = threading.Lock()
    copies = [threading.Thread(target=process_group.copy_lines, args=(stream, sink, b"", lock), daemon=True)
              for s in starters for stream, sink in ((s.popen.stdout, sys.stdout.buffer),
                                                     (s.popen.stderr, sys.stderr.buffer))]
    for thread in copies:
        thread.start()
    try:
        first = process_group.watch(starters, grace_s)
    finally:
        for s in starters:
            s.kill()  # their inputs closed: nothing waits on this starter any more
    for thread in copies:
        thread.join(timeout=5)
    if first is None:
        return 0
    index, status = first
    g = groups[index]
    ids = f"process {g.first_id}" if g.count == 1 else f"processes {g.first_id}-{g.first_id + g.count - 1}"
    why = (f" ({_SSH_STATUS} is ssh's own: {g.host} was not reached, or could not start kfast; "
           f"try `ssh {g.host} {shlex.quote(sys.executable)} -m kfast.cli doctor`)"
           if status == _SSH_STATUS and not preflight.is_local(g.host) else "")
    print(f"kfast: the JAX {ids} of {count} on {g.host} ended first, with status {status}{why}.\n"
          f"Exit code: {status}", file=sys.stderr, flush=True)
    return status
