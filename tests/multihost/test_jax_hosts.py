"""The JAX engine across hosts that share no files: `kfast launch -H` starts a per-host starter over real ssh
on the namespace harness, and the job's processes join over the hosts' addresses.

The jobs run tests/distributed/jax_job.py with .venv-jax's Python (Keras on JAX, no TensorFlow), at the same
path on every host, as a user's cluster has one environment everywhere; what each process writes goes to its
own host's disk (harness.HOST_DIR/work), read here from outside.
"""

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JAX_BIN = os.path.join(REPO, ".venv-jax", "bin")
JOB = os.path.join(REPO, "tests", "distributed", "jax_job.py")
WORK = f"{harness.HOST_DIR}/work"
RESUMABLE = 75
# Each process's share, and the whole run's shape: 2 processes x 2 devices x batches of 8 = one of 16 on 4.
SHAPE = ["--batch", "8", "--epochs", "3", "--warmup-epochs", "0"]


def _jax_env(devices):
    if not os.path.exists(os.path.join(JAX_BIN, "python")):
        pytest.fail("the JAX engine's tests need .venv-jax: run `make backend-setup` (make test does)")
    return {"PATH": JAX_BIN + os.pathsep + os.environ.get("PATH", ""), "KERAS_BACKEND": "jax",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "TF_CPP_MIN_LOG_LEVEL": "3"}


def _launch(cluster, directory, *args, hosts="hostA:1,hostB:1", expect=0, timeout=200):
    cmd = [os.path.join(JAX_BIN, "kfast"), "launch", "-np", "2", "-H", hosts, JOB, directory, *SHAPE, *args]
    proc = cluster.run("hostA", cmd, timeout=timeout, env=_jax_env(2))
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _weights(cluster, host, directory, rank):
    return np.load(cluster.path(host, "work", directory, f"weights-{rank}.npy"))


def _steps(cluster, host, directory, rank):
    with open(cluster.path(host, "work", directory, f"log-{rank}.txt")) as f:
        return f.read().splitlines()


@pytest.mark.timeout(600)
def test_jax_processes_on_two_hosts_train_as_one_process_with_four_devices_and_resume_from_the_chiefs_disk(
        cluster, tmp_path):
    # The reference: one process with 4 devices, the global batches of 16 at the rate 2 processes reach.
    four = tmp_path / "four"
    four.mkdir()
    reference = subprocess.run([os.path.join(JAX_BIN, "python"), JOB, str(four), "--batch", "16", "--lr", "0.04",
                                "--epochs", "3", "--warmup-epochs", "0"],
                               env={**os.environ, **_jax_env(4)}, capture_output=True, text=True, timeout=200)
    assert reference.returncode == 0, reference.stderr[-3000:]

    out = _launch(cluster, f"{WORK}/whole")
    assert "kfast.cluster.jax_processes -np 2 -H hostA:1,hostB:1" in out.stdout
    whole = [_weights(cluster, host, "whole", rank) for rank, host in enumerate(("hostA", "hostB"))]
    np.testing.assert_array_equal(whole[0], whole[1])  # one global array: the same on both hosts
    np.testing.assert_allclose(whole[0], np.load(four / "weights-0.npy"), atol=1e-5)
    assert "epoch-0003-batch-0004.keras" in os.listdir(cluster.path("hostA", "work", "whole", "checkpoints"))
    # Process 1 wrote no checkpoint, on its own disk or anywhere (its audit hook saw no such file opened).
    assert not os.path.exists(cluster.path("hostB", "work", "whole", "checkpoints"))
    with open(cluster.path("hostB", "work", "whole", "writes-1.txt")) as f:
        assert f.read() == ""

    # SIGTERM to the process on hostB stops both after the same step; the checkpoint is on hostA's disk alone,
    # and the resumed job (hostB loads rank 0's bytes) ends where the uninterrupted one did.
    cut = _launch(cluster, f"{WORK}/cut", "--signal-at", "7", "--signal-rank", "1", expect=RESUMABLE)
    assert f"the checkpoint is {WORK}/cut/checkpoints/epoch-0002-batch-0002.keras" in cut.stdout + cut.stderr
    assert [len(_steps(cluster, host, "cut", rank)) for rank, host in enumerate(("hostA", "hostB"))] == [8, 8]
    assert not os.path.exists(cluster.path("hostB", "work", "cut", "checkpoints"))
    _launch(cluster, f"{WORK}/cut", "--resume")
    for rank, host in enumerate(("hostA", "hostB")):
        cut_steps, whole_steps = _steps(cluster, host, "cut", rank), _steps(cluster, host, "whole", rank)
        assert len(cut_steps) == len(whole_steps) == 18  # no batch trained twice, none left out
        assert [s.split()[2] for s in cut_steps] == [s.split()[2] for s in whole_steps]  # the rates too
        np.testing.assert_array_equal(_weights(cluster, host, "cut", rank), whole[rank])


@pytest.mark.timeout(300)
def test_a_host_that_fails_ends_the_job_on_every_host_within_a_bound(fresh, tmp_path):
    # hostB's process dies at once (its script is missing there: hosts share no files); process 0 on hostA
    # would wait for it for ever in jax.distributed.initialize.
    script = "train.py"
    with open(fresh.path("hostA", "work", script), "w") as f:
        f.write("import kfast, time\nkfast.distributed.init()\ntime.sleep(600)\n")
    start = time.monotonic()
    # The starter kfast launch runs, with a grace of 1 s instead of 30 for the others to end on their own.
    python = os.path.join(JAX_BIN, "python")
    cmd = [python, "-m", "kfast.cluster.jax_processes", "-np", "2", "-H", "hostA:1,hostB:1", "--grace", "1", "--",
           python, script]
    proc = fresh.run("hostA", cmd, timeout=150, env=_jax_env(1))
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[1] " in proc.stderr and "can't open file" in proc.stderr  # hostB's own error, after its id
    assert "kfast: the JAX process 1 of 2 on hostB ended first, with status 2." in proc.stderr
    assert took < 1 + 10 + 30, took  # the grace, SIGKILL's delay after SIGTERM, and the start itself
    assert not [c for host in ("hostA", "hostB") for c in fresh.processes(host).values() if "kfast" in c or script in c]


WAITER = '''
import os, signal, sys, time
mark = os.path.join(sys.argv[1], "process-" + os.environ["KERAS_DISTRIBUTION_PROCESS_ID"])
def stop(signum, frame):
    open(mark + ".stopped", "w").write(str(signum))
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
open(mark + ".up", "w").write(os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"])
time.sleep(600)
'''


def _start_waiters(cluster, run):
    for host in ("hostA", "hostB"):
        os.makedirs(cluster.path(host, "work", run))
        with open(cluster.path(host, "work", "waiter.py"), "w") as f:
            f.write(WAITER)
    cmd = [os.path.join(JAX_BIN, "python"), "-m", "kfast.cluster.jax_processes", "-np", "2", "-H", "hostA:1,hostB:1",
           "--", os.path.join(JAX_BIN, "python"), "waiter.py", run]
    proc = cluster.popen("hostA", cmd, env=_jax_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ups = [cluster.path(host, "work", run, f"process-{i}.up") for i, host in enumerate(("hostA", "hostB"))]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(p) for p in ups) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(os.path.exists(p) for p in ups), proc.communicate(timeout=30)
    with open(ups[1]) as f:
        assert f.read().startswith("hostA:")  # process 0's host, as the others reach it
    return proc


def _stopped(cluster, run):
    paths = [cluster.path(host, "work", run, f"process-{i}.stopped") for i, host in enumerate(("hostA", "hostB"))]
    found = []
    for path in paths:
        try:
            with open(path) as f:
                found.append(f.read())
        except FileNotFoundError:
            found.append(None)
    return found


@pytest.mark.timeout(180)
def test_signals_reach_the_other_hosts_processes_and_a_killed_launcher_leaves_none_behind(fresh):
    # SIGTERM to the starter goes to hostB's starter as a line over ssh, and on to its process.
    proc = _start_waiters(fresh, "term")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == RESUMABLE, err
    assert _stopped(fresh, "term") == [str(int(signal.SIGTERM))] * 2
    assert "Exit code: 75" in err

    # Killed outright, the starter can send nothing: its end of every host's input closes, and each host's
    # starter stops its processes (SIGTERM: they stop as on a preemption).
    proc = _start_waiters(fresh, "kill")
    os.kill(proc.pid, signal.SIGKILL)  # the starter alone: what it started must stop on its own
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    left = None
    while time.monotonic() < deadline:
        left = [c for host in ("hostA", "hostB") for c in fresh.processes(host).values() if "waiter.py" in c]
        if not left:
            break
        time.sleep(0.2)
    assert not left
    assert _stopped(fresh, "kill") == [str(int(signal.SIGTERM))] * 2


@pytest.mark.timeout(150)
def test_the_preflight_names_a_missing_directory_and_a_loopback_hostname_before_any_process_starts(fresh):
    # Unchecked, a loopback hostname costs JAX's Gloo its connect timeout (about 100 s here) and then fails.
    os.makedirs(fresh.path("hostA", "work", "only-on-a"))
    loopback = fresh.write_hosts_file("loopback-hostB", "127.0.1.1 hostB\n127.0.100.1 hostA\n127.0.100.3 hostC\n")
    fresh.bind("hostB", loopback, "/etc/hosts")
    cmd = [os.path.join(JAX_BIN, "kfast"), "launch", "-np", "2", "-H", "hostA:1,hostB:1", JOB, "x", "--batch", "8"]
    proc = fresh.run("hostA", cmd, cwd=f"{WORK}/only-on-a", timeout=120, env=_jax_env(1))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "kfast launch: checking hostA, hostB (ssh, working directory, versions, hostnames;" in proc.stdout
    problems = sorted(line for line in proc.stderr.splitlines() if line.startswith("kfast launch: hostB: "))
    assert len(problems) == 2, proc.stderr
    assert problems[0].startswith("kfast launch: hostB: its own hostname 'hostB' resolves to 127.0.1.1, a loopback "
                                  "address (Debian's `127.0.1.1 <hostname>` line), so Gloo fails in "
                                  "kfast.distributed.init()"), problems[0]
    assert problems[1].startswith(f"kfast launch: hostB: the working directory {WORK}/only-on-a does not exist there "
                                  "(kfast launch runs each process in the launching directory)"), problems[1]
    assert "2 problem(s) found, so no JAX process was started" in proc.stderr
    assert not re.search(r"^\[\d\] ", proc.stdout + proc.stderr, re.M)  # no process ever started (or printed)
    # kfast doctor --hosts runs the same checks for the engine of Keras's backend.
    doctor = fresh.run("hostA", [os.path.join(JAX_BIN, "kfast"), "doctor", "--hosts", "hostA,hostB"], timeout=100,
                       env=_jax_env(1))
    assert doctor.returncode == 1, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    assert re.search(r"  hostA: kfast \S+, Keras \S+, JAX \S+; hostname hostA -> 127\.0\.100\.1", doctor.stdout)
    assert "hostB: its own hostname 'hostB' resolves to 127.0.1.1" in doctor.stdout
