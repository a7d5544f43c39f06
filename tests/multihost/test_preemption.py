"""Preemption across hosts (issue 27): SIGTERM reaches one rank on hostB; both ranks stop after the same step,
rank 0 writes the step checkpoint to hostA's own disk, and the job resumed over ssh trains as if never stopped.
"""

import os
import sys

import numpy as np
import pytest

import harness
from helpers import REPO
from helpers import assert_stopped_resumably
from runner import horovodrun

SCRIPT = os.path.join(REPO, "tests", "distributed", "preempt_script.py")
HOSTS = "hostA:1,hostB:1"
NAMES = ("hostA", "hostB")


def _files(cluster, directory, kind):
    out = []
    for rank, name in enumerate(NAMES):
        path = cluster.path(name, "work", directory, f"{kind}-{rank}.{'npy' if kind == 'weights' else 'txt'}")
        if kind == "weights":
            out.append(np.load(path))
        else:
            with open(path) as f:
                out.append(f.read().splitlines())
    return out


@pytest.mark.timeout(400)
def test_sigterm_on_one_host_stops_both_with_a_step_checkpoint_on_rank0s_disk_and_resumes_exactly(cluster):
    for name in NAMES:
        for run in ("plain", "preempted"):
            os.makedirs(cluster.path(name, "work", run), exist_ok=True)
    work = f"{harness.HOST_DIR}/work"
    horovodrun(cluster, HOSTS, SCRIPT, f"{work}/plain", "--seed", 7, timeout=200)
    out = horovodrun(cluster, HOSTS, SCRIPT, f"{work}/preempted", "--seed", 7, "--signal-at", 6, "--signal-rank", 1,
                     timeout=200, expect_fail=True)
    assert_stopped_resumably(out, 2)
    steps = [[line for line in log if not line.startswith("end")] for log in _files(cluster, "preempted", "log")]
    assert len(steps[0]) == len(steps[1]) == 8  # the note travels with the next step's gradients
    assert sorted(os.listdir(cluster.path("hostA", "work", "preempted", "checkpoints"))) == [
        "best.keras", "epoch-0001.keras", "epoch-0002-batch-0003.keras"]
    assert not os.path.exists(cluster.path("hostB", "work", "preempted", "checkpoints"))  # rank 0's disk only
    horovodrun(cluster, HOSTS, SCRIPT, f"{work}/preempted", "--resume", timeout=200)
    assert _files(cluster, "preempted", "log") == _files(cluster, "plain", "log")
    plain, resumed = _files(cluster, "plain", "weights"), _files(cluster, "preempted", "weights")
    assert np.array_equal(resumed[0], resumed[1]) and np.array_equal(resumed[0], plain[0])
