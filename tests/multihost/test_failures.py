"""A host that dies or drops off the network, and a rank that is stopped: how a job ends, and what is left.

Measured times are printed (run pytest with -s to see them).
"""

import signal
import subprocess
import sys
import time

import pytest

import harness
from runner import SCRIPTS, Job, wait_until

HOSTS = "hostA:1,hostB:1"
GLOO_TIMEOUT_S = 20  # HOROVOD_GLOO_TIMEOUT_SECONDS for the disconnect test (Horovod's default is 30)


def _start(cluster, script, *args, env=None):
    cmd = ["horovodrun", "-np", "2", "-H", HOSTS, sys.executable, f"{SCRIPTS}/{script}", *map(str, args)]
    return Job(cluster, cmd, env=env)


def _ready(marker, ranks=(0, 1)):
    return lambda lines: all(any(f"[{r}]<stdout>:rank {r} {marker}" in line for line in lines) for r in ranks)


def _left_on(cluster, name):
    """{pid: command} of what still runs on host `name` after up to 10 s to wind down."""
    wait_until(lambda: not cluster.processes(name), timeout=10)
    return cluster.processes(name)


@pytest.mark.timeout(150)
def test_killed_host_ends_the_job_quickly_and_leaves_nothing_on_the_survivor(fresh):
    cluster = fresh
    job = _start(cluster, "allreduce_loop.py", 120)
    job.wait_for(_ready("ready"), timeout=90, what="both ranks ready")
    killed = cluster.kill_processes("hostB")  # every process of hostB, its sshd included, as a crash would
    assert killed
    code, took = job.wait(timeout=30)
    print(f"\nhost killed: horovodrun exited {code} after {took:.1f} s")
    assert code != 0, job.output
    assert took < 15, job.output
    assert _left_on(cluster, "hostA") == {}


@pytest.mark.timeout(180)
def test_disconnected_host_ends_the_job_within_gloos_timeout(fresh):
    cluster = fresh
    job = _start(cluster, "allreduce_loop.py", 150, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S)})
    job.wait_for(_ready("ready"), timeout=90, what="both ranks ready")
    cluster.link("hostB", up=False)  # packets to and from hostB vanish: no reset, no error, silence
    code, took = job.wait(timeout=GLOO_TIMEOUT_S + 60)
    print(f"\nhost cut off: horovodrun exited {code} after {took:.1f} s (Gloo timeout {GLOO_TIMEOUT_S} s)")
    assert code != 0, job.output
    assert took < GLOO_TIMEOUT_S + 30, job.output
    assert _left_on(cluster, "hostA") == {}
    # The cut-off host cannot be told: its rank stays until its own timeout (fresh cleans it up).


@pytest.mark.timeout(150)
def test_stopped_rank_frees_shared_memory_and_fork_server_dir(fresh):
    cluster = fresh
    job = _start(cluster, "loader_job.py", "--fail-rank", "1")
    job.wait_for(_ready("loader ready"), timeout=90, what="both loaders ready")
    code, took = job.wait(timeout=60)
    print(f"\nrank 1 failed: horovodrun exited {code} after {took:.1f} s")
    assert code != 0 and took < 20, job.output
    # horovodrun stopped rank 0 (on hostA, its own host) with SIGTERM, and kfast's handler ran (SIGKILL runs
    # none) ...
    assert "[0]<stdout>:rank 0 ends on a stop signal" in job.output.splitlines(), job.output
    assert "rank 0 was not stopped" not in job.output
    assert "leaked shared_memory" not in job.output, job.output
    # ... and neither host keeps a segment in /dev/shm or a /tmp/pymp-* directory (each has its own).
    for name in ("hostA", "hostB"):
        assert wait_until(lambda: _private_leftovers(cluster, name) == [], timeout=10) is True, (
            name, _private_leftovers(cluster, name), job.output)


def _private_leftovers(cluster, name):
    # kfast's own segments only (kfast_*): horovodrun's multiprocessing semaphores (sem.mp-*) are Horovod's.
    proc = cluster.run(name, ["sh", "-c", "ls -d /dev/shm/kfast_* /tmp/pymp-* 2>/dev/null; true"], timeout=20)
    return proc.stdout.split()


@pytest.mark.timeout(90)
def test_sighup_frees_shared_memory_and_fork_server_dir(fresh):
    cluster = fresh
    p = cluster.popen("hostB", [sys.executable, f"{SCRIPTS}/loader_job.py"], stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "loader ready" not in line and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
        assert "rank 0 loader ready" in line, p.stdout.read()
        assert len(_private_leftovers(cluster, "hostB")) >= 2  # a segment and the fork server's directory
        p.send_signal(signal.SIGHUP)
        code = p.wait(timeout=30)
        rest = p.stdout.read()
    finally:
        harness.Cluster.kill_session(p)
        p.wait(timeout=10)
        p.stdout.close()
    assert code == -signal.SIGHUP, rest  # it still dies of the signal, as without kfast
    assert "rank 0 ends on a stop signal" in rest, rest  # after kfast's clean-ups
    assert "leaked" not in rest, rest
    assert wait_until(lambda: _private_leftovers(cluster, "hostB") == [], timeout=10) is True, (
        _private_leftovers(cluster, "hostB"))
