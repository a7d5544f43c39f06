"""kfast launch's starter of JAX processes (kfast/cluster/jax_processes.py), with plain Python processes in place
of training scripts: what each is told, how a failure and a stop signal end the job."""

import os
import signal
import subprocess
import sys
import time

import pytest

STARTER = [sys.executable, "-m", "kfast.cluster.jax_processes"]


def _start(tmp_path, np, body, *options):
    script = tmp_path / "process.py"
    script.write_text("import os, signal, sys, time\n"
                      f"out = {str(tmp_path)!r} + '/p' + os.environ['KERAS_DISTRIBUTION_PROCESS_ID']\n" + body)
    return subprocess.Popen([*STARTER, "-np", str(np), *options, "--", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_each_process_is_told_the_job_and_its_place_in_it(tmp_path):
    keys = ["KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID",
            "KFAST_LOCAL_RANK", "KFAST_LOCAL_SIZE", "KERAS_BACKEND"]
    proc = _start(tmp_path, 3, f"open(out, 'w').write(repr([os.environ[k] for k in {keys!r}]))\n"
                               "print('a line ' * 2000, flush=True)\n")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # Every line whole, after its process's id, even one longer than a pipe's buffer.
    assert sorted(out.splitlines()) == [f"[{i}] " + "a line " * 2000 for i in range(3)]
    told = [eval((tmp_path / f"p{i}").read_text()) for i in range(3)]
    address = told[0][0]
    assert address.startswith("127.0.0.1:") and int(address.split(":")[1]) > 0
    assert told == [[address, "3", str(i), str(i), "3", "jax"] for i in range(3)]


@pytest.mark.timeout(60)
def test_a_failed_process_ends_the_job_with_its_status_and_the_others_are_stopped(tmp_path):
    # Process 1 fails at once; process 0 would wait for ever (as in a collective with a dead peer).
    body = ("open(out, 'w').write(str(os.getpid()))\n"
            "if os.environ['KERAS_DISTRIBUTION_PROCESS_ID'] == '1':\n    sys.exit(3)\n"
            "time.sleep(600)\n")
    start = time.monotonic()
    proc = _start(tmp_path, 2, body, "--grace", "1")
    out, err = proc.communicate(timeout=50)
    assert proc.returncode == 3
    assert time.monotonic() - start < 30
    assert "kfast: JAX process 1 of 2 ended first, with status 3.\nExit code: 3" in err
    waiting = int((tmp_path / "p0").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(waiting, 0)  # stopped, and reaped by the starter


@pytest.mark.timeout(60)
def test_sigterm_reaches_every_process_and_a_resumable_stop_keeps_status_75(tmp_path):
    body = ("def stop(signum, frame):\n    open(out + '.stopped', 'w').write(str(signum))\n    sys.exit(75)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "open(out, 'w').write('up')\n"
            "time.sleep(600)\n")
    proc = _start(tmp_path, 2, body)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"p{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert [(tmp_path / f"p{i}.stopped").read_text() for i in range(2)] == [str(int(signal.SIGTERM))] * 2
    assert "Exit code: 75" in err
