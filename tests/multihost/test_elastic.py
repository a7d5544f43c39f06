"""Elastic training across hosts: a host's ranks die mid-epoch, the job goes on with the others, the host
comes back through the discovery script and joins, and the job ends with every rank identical.

Real `horovodrun --min-np/--max-np --host-discovery-script` (Horovod's elastic driver, Gloo) over ssh
between namespace hosts; times are printed (pytest -s).
"""

import collections
import glob
import json
import os
import shutil
import signal
import sys
import time

import pytest

import harness
from runner import SCRIPTS, Job, wait_until

WORK = f"{harness.HOST_DIR}/work"
BATCHES, COMMIT_EVERY = 48, 3  # as in elastic_job.py


def _write_hosts(cluster, names):
    with open(cluster.path("hostA", "work", "hosts.txt"), "w") as f:
        f.write("".join(f"{name}:1\n" for name in names))


def _start(cluster, np, min_np, max_np, epochs, extra=()):
    with open(cluster.path("hostA", "work", "discover.sh"), "w") as f:
        f.write(f"#!/bin/sh\ncat {WORK}/hosts.txt\n")
    os.chmod(cluster.path("hostA", "work", "discover.sh"), 0o755)
    for name in cluster.names:  # the hosts' disks outlive a test: start each job with empty records
        shutil.rmtree(cluster.path(name, "work", "out"), ignore_errors=True)
        os.makedirs(cluster.path(name, "work", "out"))
    cmd = ["horovodrun", "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
           "--host-discovery-script", f"{WORK}/discover.sh", *extra, sys.executable, f"{SCRIPTS}/elastic_job.py",
           f"{WORK}/out", str(epochs)]
    return Job(cluster, cmd)


def _lines(cluster, kind, hosts=None):
    """[(host, fields...)] of every record file `kind` on the hosts' disks."""
    out = []
    for name in hosts or cluster.names:
        for path in sorted(glob.glob(cluster.path(name, "work", "out", f"{kind}-*.txt"))):
            with open(path) as f:
                out += [(name, *line.split()) for line in f if line.strip()]
    return out


def _kill_job(cluster, name):
    """SIGKILLs the job's processes on host `name` (its sshd stays, so the host can serve again)."""
    pids = list(cluster.processes(name))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@pytest.fixture
def jobs():
    """Started jobs, stopped at the end of the test whatever happened (their pipes closed)."""
    started = []
    yield started
    for job in started:
        if job.proc.poll() is None:
            job.stop()
        elif not job.proc.stdout.closed:
            job.proc.stdout.close()


@pytest.mark.timeout(400)
def test_a_host_dies_mid_epoch_the_job_goes_on_and_the_host_rejoins(fresh, jobs):
    cluster = fresh
    _write_hosts(cluster, ["hostA", "hostB", "hostC"])
    job = _start(cluster, 3, 2, 3, 60, extra=["--blacklist-cooldown-range", "2", "4", "--elastic-timeout", "120"])
    jobs.append(job)
    # hostC trains into the second epoch, then its ranks die and it leaves the discovery script's list.
    if not wait_until(lambda: [r for r in _lines(cluster, "trained", ["hostC"]) if int(r[1]) >= 1 and int(r[2]) >= 12],
                      timeout=150):
        job.stop()
        pytest.fail(f"hostC never reached epoch 1:\n{job.output}")
    killed_at = time.time()
    assert _kill_job(cluster, "hostC")
    # Then off the list (before the 2-4 s blacklist cooldown ends): a delisted host's ranks would be stopped
    # by the driver itself, not killed.
    _write_hosts(cluster, ["hostA", "hostB"])
    # The survivors go on; the time lost is from the kill to their next trained batch.
    resumed = wait_until(lambda: [float(r[3]) for r in _lines(cluster, "trained", ["hostA", "hostB"])
                                  if float(r[3]) > killed_at + 0.05], timeout=120)
    assert resumed, job.output
    two_ranks = wait_until(lambda: [r for r in _lines(cluster, "epochs", ["hostA"]) if r[2] == "2"], timeout=120)
    assert two_ranks, job.output
    time.sleep(max(0.0, killed_at + 5 - time.time()))  # past the blacklist cooldown
    _write_hosts(cluster, ["hostA", "hostB", "hostC"])
    rejoin_asked = time.time()
    three_again = wait_until(lambda: [r for r in _lines(cluster, "epochs", ["hostA"])
                                      if r[2] == "3" and int(r[1]) > int(two_ranks[0][1])], timeout=150)
    assert three_again, job.output
    joined_at = min(float(r[3]) for r in _lines(cluster, "trained", ["hostC"]) if float(r[3]) > rejoin_asked)
    for name in cluster.names:  # on every disk: after the rejoin, rank 0 may be on any host
        with open(cluster.path(name, "work", "out", "finish"), "w"):
            pass
    code, _ = job.wait(timeout=120)
    assert code == 0, job.output

    finals = {}
    for name in cluster.names:
        for path in glob.glob(cluster.path(name, "work", "out", "final-rank*.json")):
            with open(path) as f:
                finals[(name, os.path.basename(path))] = json.load(f)
    # One rank per host; Horovod numbers them anew after the rejoin, so which host is rank 0 may change.
    assert sorted(host for host, _ in finals) == ["hostA", "hostB", "hostC"], job.output
    assert sorted(name for _, name in finals) == ["final-rank0.json", "final-rank1.json", "final-rank2.json"]
    states = [f["state"] for f in finals.values()]
    assert states[0] == states[1] == states[2]  # weights and SGD momentum, bit for bit, on all three
    chief = next(f for (_, name), f in finals.items() if name == "final-rank0.json")
    assert chief["size"] == 3
    resets = chief["resets"]
    assert [(r["size_before"], r["size_after"]) for r in resets] == [(3, 2), (2, 3)], resets
    assert resets[0]["reason"].startswith("lost a rank") and resets[1]["reason"] == "hosts changed", resets

    # Epochs went on from where they were: each ended once, in order, none started over.
    ended = [int(r[1]) for r in _lines(cluster, "epochs", ["hostA"])]
    assert ended == list(range(len(ended))), ended
    # Every batch of every epoch trained once, except those redone after the last commit before the loss
    # (a window of at most COMMIT_EVERY + 1 steps of 3 ranks) and fewer trailing ones than ranks.
    counts = collections.defaultdict(collections.Counter)
    for _, epoch, index, _ in _lines(cluster, "trained"):
        counts[int(epoch)][int(index)] += 1
    lost_epoch, restored_at = resets[0]["epoch"], resets[0]["position"]
    for epoch in range(len(ended)):
        twice = sorted(i for i, c in counts[epoch].items() if c > 1)
        missing = sorted(set(range(BATCHES)) - set(counts[epoch]))
        assert all(i >= BATCHES - 2 for i in missing), (epoch, missing)
        assert max(counts[epoch].values()) <= 2, (epoch, counts[epoch])
        if epoch == lost_epoch:
            assert len(twice) <= 3 * (COMMIT_EVERY + 1) and all(i >= restored_at for i in twice), (twice, restored_at)
        else:
            assert not twice, (epoch, twice)
    # The learning rate follows the linear rule for each size: 0.01 x ranks.
    rates = {(int(size), float(lr)) for _, size, lr in _lines(cluster, "rates")}
    assert {size for size, _ in rates} == {2, 3}
    assert all(lr == pytest.approx(0.01 * size, rel=1e-6) for size, lr in rates), rates
    print(f"\nelastic: lost hostC -> next trained batch {min(resumed) - killed_at:.1f} s after the kill; hostC "
          f"back in the list -> trained again {joined_at - rejoin_asked:.1f} s later; resets {resets}")


@pytest.mark.timeout(200)
def test_below_min_np_the_job_ends_with_a_clear_error(fresh, jobs):
    cluster = fresh
    _write_hosts(cluster, ["hostA", "hostB"])
    job = _start(cluster, 2, 2, 2, 60, extra=["--elastic-timeout", "10"])
    jobs.append(job)
    if not wait_until(lambda: _lines(cluster, "trained", ["hostB"]), timeout=150):
        job.stop()
        pytest.fail(f"hostB never trained:\n{job.output}")
    assert _kill_job(cluster, "hostB")
    _write_hosts(cluster, ["hostA"])
    code, took = job.wait(timeout=90)
    print(f"\nbelow --min-np: horovodrun exited {code} {took:.1f} s after the kill")
    assert code != 0
    assert "Timed out waiting for" in job.output and "at least 2" in job.output, job.output[-3000:]
