"""kfast on a real Slurm (issue 28): slurmctld, slurmd and munged on namespace hosts node01-node03 (slurm.py),
jobs submitted with sbatch, ranks started by `kfast launch` with horovodrun over ssh between the job's nodes.

Measured times are printed (run pytest with -s to see them).
"""

import json
import os
import re
import time

import numpy as np
import pytest

import harness
import slurm
from helpers import REPO, readme_scale_out_snippet
from runner import wait_until
from test_training import MY_PROJECT, REPORT

pytestmark = pytest.mark.slurm  # its own tier, not `multihost` (tests/conftest.py)

NODES = ("node01", "node02", "node03")
WORK = f"{harness.HOST_DIR}/work"
PREEMPT = os.path.join(REPO, "tests", "distributed", "preempt_script.py")
LAUNCH = f"exec python -m kfast.cli launch"


@pytest.fixture(scope="module")
def cluster():
    reason = harness.unavailable_reason() or slurm.unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = harness.Cluster(NODES).start()
    try:
        s = slurm.Slurm(c).start()
        print(f"\nSlurm harness up in {c.setup_s + s.setup_s:.2f} s (hosts {c.setup_s:.2f} s, munged + slurmctld "
              f"+ slurmd {s.setup_s:.2f} s)")
        c.slurm = s
        yield c
        s.stop()
    finally:
        c.close()


def _script(cluster, name, *lines, options=()):
    with open(cluster.path(NODES[0], "work", name), "w") as f:
        f.write("#!/bin/bash\n" + "".join(f"#SBATCH {o}\n" for o in options) + "\n".join(lines) + "\n")
    return f"{WORK}/{name}"


def _output(cluster, job_id):
    try:
        with open(cluster.path(NODES[0], "work", f"slurm-{job_id}.out"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _finished(cluster, job_id, timeout, states=("COMPLETED",)):
    try:
        return cluster.slurm.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"},
                                        timeout)
    except TimeoutError as e:
        cluster.slurm.run(["scancel", job_id], check=False)
        pytest.fail(f"{e}\n{_output(cluster, job_id)[-5000:]}")


def _leftovers(cluster, name):
    """What runs on host `name` but the harness's and Slurm's daemons, and its kfast segments and /tmp/pymp-*."""
    daemons = {p.pid for p in cluster.slurm.daemons}
    procs = {pid: cmd for pid, cmd in cluster.processes(name).items()
             if pid not in daemons and cmd != "slurmctld: slurmscriptd"}  # slurmctld's own helper
    # kfast's own segments only (kfast_*): horovodrun leaves its multiprocessing semaphores (sem.mp-*) when
    # Slurm kills it before its exit handlers run; they are Horovod's, not kfast's.
    files = cluster.run(name, ["sh", "-c", "ls -d /dev/shm/kfast_* /tmp/pymp-* 2>/dev/null; true"], timeout=20)
    return procs, files.stdout.split()


@pytest.mark.timeout(120)
def test_a_compressed_node_list_and_uneven_tasks_give_the_hosts_slurm_laid_out(cluster):
    script = _script(cluster, "layout.sh", 'echo "nodelist $SLURM_JOB_NODELIST tasks $SLURM_TASKS_PER_NODE"',
                     "python -m kfast.cli launch --dry-run tabular", "srun -l hostname")
    job = cluster.slurm.sbatch(script, "-N", "3", "-n", "5")
    fields = _finished(cluster, job, 60)
    out = _output(cluster, job)
    assert fields["JobState"] == "COMPLETED", out
    nodelist, tasks = re.search(r"nodelist (\S+) tasks (\S+)", out).groups()
    assert nodelist == "node[01-03]"
    placed = {}  # what srun did with the same allocation: "task: host" lines
    for host in re.findall(r"^\d+: (node\d\d)$", out, re.M):
        placed[host] = placed.get(host, 0) + 1
    expected = ",".join(f"{host}:{placed[host]}" for host in NODES)
    assert len(set(placed.values())) > 1, out  # uneven, e.g. 2(x2),1
    assert f"kfast launch: Slurm job {job}: {expected} (5 slot(s))" in out, out
    assert re.search(rf"horovodrun -np 5 -H {expected} ", out), out
    print(f"\nSLURM_JOB_NODELIST={nodelist} SLURM_TASKS_PER_NODE={tasks} -> -H {expected}")


@pytest.mark.timeout(300)
def test_sbatch_runs_the_printed_script_for_a_recipe_on_two_nodes(cluster):
    printed = cluster.run(NODES[0], ["python", "-m", "kfast.cli", "launch", "--print-sbatch", "--nodes", "2", "tabular",
                                     "--epochs", "2", "--workers", "1", "--samples", "512", "--checkpoint-dir",
                                     "recipe-ckpt"], timeout=60)
    assert printed.returncode == 0, printed.stderr
    with open(cluster.path(NODES[0], "work", "recipe.sbatch"), "w") as f:
        f.write(printed.stdout)
    start = time.monotonic()
    job = cluster.slurm.sbatch(f"{WORK}/recipe.sbatch", "--output", "slurm-%j.out")
    fields = _finished(cluster, job, 240)
    out = _output(cluster, job)
    print(f"\nrecipe job: sbatch to end {time.monotonic() - start:.1f} s")
    assert fields["JobState"] == "COMPLETED", out[-5000:]
    assert f"kfast launch: Slurm job {job}: node01:1,node02:1 (2 slot(s))" in out
    assert "kfast recipe tabular: 2 rank(s)" in out
    losses = [float(v) for v in re.findall(r" - loss: ([0-9.e+-]+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], out[-5000:]
    assert sorted(os.listdir(cluster.path(NODES[0], "work", "recipe-ckpt"))) == [
        "best.keras", "epoch-0001.keras", "epoch-0002.keras"]
    assert not os.path.exists(cluster.path(NODES[1], "work", "recipe-ckpt"))


@pytest.mark.timeout(300)
def test_sbatch_runs_the_readme_scale_out_script_with_identical_weights_on_both_nodes(cluster):
    for name in NODES[:2]:
        with open(cluster.path(name, "work", "my_project.py"), "w") as f:
            f.write(MY_PROJECT)
        with open(cluster.path(name, "work", "train.py"), "w") as f:
            f.write(readme_scale_out_snippet() + REPORT)
    script = _script(cluster, "readme.sh", f"{LAUNCH} train.py", options=["--nodes=2", "--ntasks-per-node=1"])
    start = time.monotonic()
    job = cluster.slurm.sbatch(script)
    # sbatch to the first step: rank 0's first epoch line (Keras prints "Epoch 1/10" as the epoch begins).
    first = wait_until(lambda: "Epoch 1/" in _output(cluster, job) and time.monotonic(), timeout=180)
    fields = _finished(cluster, job, 240)
    out = _output(cluster, job)
    assert fields["JobState"] == "COMPLETED", out[-5000:]
    print(f"\nREADME script job: sbatch to the first epoch {first - start:.1f} s, to the end "
          f"{time.monotonic() - start:.1f} s")
    reports = []
    for rank, name in enumerate(NODES[:2]):
        with open(cluster.path(name, "work", f"report-rank{rank}.json")) as f:
            reports.append(json.load(f))
    assert reports[0]["size"] == 2 and reports[0]["state"] == reports[1]["state"]  # bit for bit


_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
          "DEADLINE"}


@pytest.mark.timeout(300)
def test_scancel_ends_every_rank_on_every_node_within_a_bound_and_leaves_nothing(cluster):
    script = _script(cluster, "long.sh", f"{LAUNCH} tabular --epochs 500 --workers 2 --samples 2048 "
                                         " --checkpoint-dir long-ckpt",
                     options=["--nodes=2", "--ntasks-per-node=1"])
    job = cluster.slurm.sbatch(script)
    # Until the second epoch shows, or the job ended: a passing state (CONFIGURING) or an scontrol that did not
    # answer under load ({}) is not an end (it once cut this wait short with no output yet).
    assert wait_until(lambda: "Epoch 2/" in _output(cluster, job)
                      or cluster.slurm.job(job).get("JobState") in _ENDED, timeout=180)
    assert "Epoch 2/" in _output(cluster, job), _output(cluster, job)[-5000:]
    ranks = {name: [cmd for cmd in _leftovers(cluster, name)[0].values() if "kfast.cli train" in cmd]
             for name in NODES[:2]}
    assert all(ranks.values()), ranks  # a rank on each node
    start = time.monotonic()
    cluster.slurm.run(["scancel", job])
    fields = _finished(cluster, job, 60)
    gone = wait_until(lambda: all(_leftovers(cluster, n) == ({}, []) for n in NODES[:2]), timeout=60)
    took = time.monotonic() - start
    print(f"\nscancel: job {fields['JobState']}, every process, segment and temp dir gone after {took:.1f} s")
    assert fields["JobState"] == "CANCELLED"
    assert gone, {n: _leftovers(cluster, n) for n in NODES[:2]}
    # Slurm sends SIGKILL after KillWait (30 s): a stop that waited for it fails here (horovodrun once hung
    # on two SIGTERMs, Slurm's and kfast launch's, arriving together).
    assert took < 15


def _log(cluster, run, rank):
    try:
        with open(cluster.path(NODES[rank], "work", run, f"log-{rank}.txt")) as f:
            return f.read().splitlines()
    except OSError:
        return []


@pytest.mark.timeout(400)
def test_the_preemption_signal_requeues_the_job_and_it_resumes_mid_epoch_with_every_batch_once(cluster):
    for name in NODES[:2]:
        for run in ("plain", "requeued"):
            os.makedirs(cluster.path(name, "work", run), exist_ok=True)
    options = ["--nodes=2", "--ntasks-per-node=1", "--requeue", "--open-mode=append"]
    submitted = time.monotonic()
    plain = cluster.slurm.sbatch(_script(cluster, "plain.sh", f"{LAUNCH} {PREEMPT} {WORK}/plain --seed 7",
                                         options=options))
    first_step = wait_until(lambda: _log(cluster, "plain", 0) and time.monotonic(), timeout=180)
    assert _finished(cluster, plain, 240)["JobState"] == "COMPLETED", _output(cluster, plain)[-5000:]
    print(f"\nsbatch to the first trained step: {first_step - submitted:.1f} s")

    marker = f"{WORK}/requeued/held"
    script = _script(cluster, "requeue.sh", f"{LAUNCH} {PREEMPT} {WORK}/requeued --seed 7 --resume --hold-at 6 "
                                            f"--marker {marker}", options=options)
    job = cluster.slurm.sbatch(script)
    held = cluster.path(NODES[0], "work", "requeued", "held")
    assert wait_until(lambda: os.path.exists(held), timeout=180), _output(cluster, job)[-5000:]
    # What --signal=B:USR1@N does at its time: USR1 to the batch script alone, here at once.
    signalled = time.monotonic()
    cluster.slurm.run(["scancel", "--signal=USR1", "--batch", job])
    said = "kfast launch: SIGUSR1 received; sending SIGTERM to the 1 rank(s) on this host"
    assert wait_until(lambda: said in _output(cluster, job), timeout=30), _output(cluster, job)[-5000:]
    time.sleep(0.5)
    open(held + ".go", "w").close()
    assert wait_until(lambda: cluster.slurm.job(job).get("Restarts", "0") != "0", timeout=60), cluster.slurm.job(job)
    base = len(_log(cluster, "requeued", 0))
    stopped_at = sorted(os.listdir(cluster.path(NODES[0], "work", "requeued", "checkpoints")))
    wait_until(lambda: len(_log(cluster, "requeued", 0)) > base, timeout=180)
    resumed = time.monotonic()
    fields = _finished(cluster, job, 240)
    out = _output(cluster, job)
    print(f"\npreemption signal to the requeued job's first step: {resumed - signalled:.1f} s")
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", out[-5000:]
    assert f"requeueing Slurm job {job}: it resumes where it stopped" in out
    # Stopped mid-epoch (held after step 6: step 7 carries the note; 5 steps per rank and epoch), then every
    # batch once, in the uninterrupted order.
    assert stopped_at == ["best.keras", "epoch-0001.keras", "epoch-0002-batch-0003.keras"], stopped_at
    assert 0 < base < len(_log(cluster, "plain", 0))
    for rank in (0, 1):
        assert _log(cluster, "requeued", rank) == _log(cluster, "plain", rank), rank
    weights = [np.load(cluster.path(NODES[r], "work", run, f"weights-{r}.npy")) for run in ("plain", "requeued")
               for r in (0, 1)]
    assert all(np.array_equal(weights[0], w) for w in weights[1:])


JAX_PYTHON = os.path.join(REPO, ".venv-jax", "bin", "python")
JAX_JOB = os.path.join(REPO, "tests", "distributed", "jax_job.py")


def _jax_steps(cluster, run, rank):
    try:
        with open(cluster.path(NODES[rank], "work", run, f"log-{rank}.txt")) as f:
            return [line.split()[2] for line in f.read().splitlines()]  # each step's learning rate
    except OSError:
        return []


@pytest.mark.timeout(500)
def test_the_jax_engine_under_slurm_trains_on_two_nodes_and_a_requeued_job_resumes_exactly(cluster):
    if not os.path.exists(JAX_PYTHON):
        pytest.fail("the JAX engine's tests need .venv-jax: run `make backend-setup` (make test does)")
    env = {"KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    shape = ["--batch", "8", "--epochs", "3", "--warmup-epochs", "0", "--resume"]

    def submit(run, *extra):
        # The script `kfast launch --print-sbatch` writes for the JAX engine, on the first two nodes (the
        # requeued run must find process 0's checkpoints on node01's disk: these hosts share none).
        printed = cluster.run(NODES[0], [JAX_PYTHON, "-m", "kfast.cli", "launch", "--print-sbatch", "--nodes", "2",
                                         "--time", "00:10:00", JAX_JOB, f"{WORK}/{run}", *shape, *extra],
                              timeout=60, env=env)
        assert printed.returncode == 0, printed.stderr
        assert "export KERAS_BACKEND=jax" in printed.stdout
        with open(cluster.path(NODES[0], "work", f"{run}.sbatch"), "w") as f:
            f.write(printed.stdout)
        return cluster.slurm.sbatch(f"{WORK}/{run}.sbatch", "--output", "slurm-%j.out", "--nodelist",
                                    ",".join(NODES[:2]), env={"XLA_FLAGS": env["XLA_FLAGS"]})

    plain = submit("jax-plain")
    fields = _finished(cluster, plain, 240)
    out = _output(cluster, plain)
    assert fields["JobState"] == "COMPLETED", out[-5000:]
    assert f"kfast launch: Slurm job {plain}: node01:1,node02:1 (2 slot(s))" in out
    assert "kfast.cluster.jax_processes -np 2 -H node01:1,node02:1" in out
    weights = [np.load(cluster.path(NODES[r], "work", "jax-plain", f"weights-{r}.npy")) for r in (0, 1)]
    np.testing.assert_array_equal(weights[0], weights[1])
    assert not os.path.exists(cluster.path(NODES[1], "work", "jax-plain", "checkpoints"))

    marker = f"{WORK}/jax-requeued-held"
    job = submit("jax-requeued", "--hold-at", "6", "--marker", marker)
    held = cluster.path(NODES[0], "work", "jax-requeued-held")
    assert wait_until(lambda: os.path.exists(held), timeout=180), _output(cluster, job)[-5000:]
    cluster.slurm.run(["scancel", "--signal=USR1", "--batch", job])  # what --signal=B:USR1@N does, at once
    said = "kfast launch: SIGUSR1 received; sending SIGTERM to the 1 rank(s) on this host"
    assert wait_until(lambda: said in _output(cluster, job), timeout=30), _output(cluster, job)[-5000:]
    open(held + ".go", "w").close()
    fields = _finished(cluster, job, 300)
    out = _output(cluster, job)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", out[-5000:]
    assert f"requeueing Slurm job {job}: it resumes where it stopped" in out
    stopped = [name for name in os.listdir(cluster.path(NODES[0], "work", "jax-requeued", "checkpoints"))
               if name == "epoch-0002-batch-0001.keras"]
    assert stopped, out[-5000:]  # stopped after step 7 (held after the 7th), inside epoch 2 of 6 steps
    for rank in (0, 1):
        # Every step once, at the uninterrupted run's rates, and its weights bit for bit.
        assert _jax_steps(cluster, "jax-requeued", rank) == _jax_steps(cluster, "jax-plain", rank), rank
        assert len(_jax_steps(cluster, "jax-plain", rank)) == 18
        np.testing.assert_array_equal(
            np.load(cluster.path(NODES[rank], "work", "jax-requeued", f"weights-{rank}.npy")), weights[rank])


@pytest.mark.timeout(300)
def test_a_jax_script_started_by_srun_joins_through_slurms_own_variables(cluster):
    # No kfast launch: srun starts one task per node, and kfast.distributed.init() (through JAX) reads the
    # step's nodes, task count and task id from Slurm.
    script = _script(cluster, "jax-srun.sh", "export KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=2",
                     f"srun {JAX_PYTHON} {JAX_JOB} {WORK}/jax-srun --batch 8 --epochs 1 --warmup-epochs 0",
                     options=["--nodes=2", "--ntasks-per-node=1", f"--nodelist={','.join(NODES[:2])}",
                              "--output=slurm-%j.out"])
    job = cluster.slurm.sbatch(script)
    fields = _finished(cluster, job, 240)
    out = _output(cluster, job)
    assert fields["JobState"] == "COMPLETED", out[-5000:]
    facts = []
    for rank in (0, 1):
        with open(cluster.path(NODES[rank], "work", "jax-srun", f"facts-{rank}.json")) as f:
            facts.append(json.load(f))
    assert [(f["rank"], f["size"], f["devices"]) for f in facts] == [(0, 2, 4), (1, 2, 4)]
    np.testing.assert_array_equal(np.load(cluster.path(NODES[0], "work", "jax-srun", "weights-0.npy")),
                                  np.load(cluster.path(NODES[1], "work", "jax-srun", "weights-1.npy")))
