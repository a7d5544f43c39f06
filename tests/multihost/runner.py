"""Running jobs on the harness's hosts from a test: horovodrun to completion, or in the background."""

import os
import subprocess
import sys
import threading
import time

import pytest

import harness
from helpers import REPO
from helpers import job_output

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
ALLREDUCE = os.path.join(REPO, "scripts", "check_allreduce.py")
JOB_ENV = {"PYTHONUNBUFFERED": "1"}  # TensorFlow's logging stays at its default: real output is asserted


def horovodrun(cluster, hosts, script, *args, np=None, timeout=180, env=None, expect_fail=False):
    """Runs `horovodrun -np N -H hosts python script args` from hostA; fails the test on a wrong exit
    status or the timeout, with everything it printed. Returns stdout + stderr."""
    np = np or sum(int(h.rsplit(":", 1)[1]) for h in hosts.split(","))
    cmd = ["horovodrun", "-np", str(np), "-H", hosts, sys.executable, script, *map(str, args)]
    return job_output(cmd, lambda: cluster.run("hostA", cmd, timeout=timeout, env={**JOB_ENV, **(env or {})}),
                      timeout=timeout, expect_fail=expect_fail)


class Job:
    """A horovodrun job started on hostA in the background, its output collected line by line."""

    def __init__(self, cluster, cmd, env=None):
        self.cmd = cmd
        self.lines = []
        self.proc = cluster.popen("hostA", cmd, env={**JOB_ENV, **(env or {})}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if predicate(self.lines):
                    return
                pytest.fail(f"the job exited ({self.proc.returncode}) before {what}:\n{self.output}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"no {what} within {timeout} s:\n{self.output}")
            time.sleep(0.05)

    def wait(self, timeout):
        """Returns (exit status, seconds it took), or fails the test after `timeout` seconds."""
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{' '.join(self.cmd)} still ran {timeout} s later:\n{self.output}")
        self._reader.join(timeout=5)
        self.proc.stdout.close()
        return code, time.monotonic() - start

    def stop(self):
        harness.Cluster.kill_session(self.proc)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        self.proc.stdout.close()


def wait_until(predicate, timeout, interval=0.1):
    """Polls `predicate` until it returns something true, at most `timeout` seconds; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)

