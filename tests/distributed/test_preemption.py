"""Preemption and exact resume (issue 27): SIGTERM at seeded steps stops every rank after the same step with
a step checkpoint and exit status 75; the resumed job trains exactly the batches the uninterrupted one would
have, in its order, at its learning rates, to bit-identical weights; a stuck step ends within the bound."""

import glob
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from helpers import REPO, assert_stopped_resumably, wait_for_file

SCRIPT = os.path.join(REPO, "tests", "distributed", "preempt_script.py")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
STEPS = 10  # batches per epoch of the script's dataset, on one rank; 3 epochs, warm-up over the first 2
# Where SIGTERM comes: the first step, the last of an epoch, the first of the next, and seeded ones (warm-up, after).
_rng = random.Random(27)
POINTS = [0, STEPS - 1, STEPS, _rng.randrange(STEPS + 1, 2 * STEPS - 1), _rng.randrange(2 * STEPS + 1, 3 * STEPS - 1)]


def _run(directory, *args, timeout=180):
    os.makedirs(directory, exist_ok=True)
    return subprocess.run([sys.executable, SCRIPT, str(directory), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=REPO)


def _log(directory, rank=0):
    with open(os.path.join(directory, f"log-{rank}.txt")) as f:
        return f.read().splitlines()


def _weights(directory, rank=0):
    return np.load(os.path.join(directory, f"weights-{rank}.npy"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    proc = _run(directory, "--seed", 7)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return directory


def test_the_uninterrupted_log_is_what_the_comparisons_rely_on(uninterrupted):
    log = _log(uninterrupted)
    steps = [line.split() for line in log if not line.startswith("end")]
    assert len(steps) == 3 * STEPS and [line.split()[1] for line in log if line.startswith("end")] == ["0", "1", "2"]
    for epoch in range(3):  # each epoch every batch once, in a new order
        assert sorted(int(s[1]) for s in steps if s[0] == str(epoch)) == list(range(STEPS))
    orders = {tuple(s[1] for s in steps if s[0] == str(e)) for e in range(3)}
    assert len(orders) == 3
    rates = [float(s[2]) for s in steps]
    assert rates[0] < rates[STEPS] < rates[2 * STEPS - 1] == rates[-1]  # warm-up per batch, then flat


@pytest.mark.parametrize("at", POINTS)
def test_sigterm_at_a_step_then_resume_trains_as_if_never_stopped(uninterrupted, tmp_path, at):
    first = _run(tmp_path, "--seed", 7, "--signal-at", at)
    assert first.returncode == 75, first.stderr[-3000:]
    assert "stopped by SIGTERM" in first.stdout + first.stderr
    assert not glob.glob(str(tmp_path / "checkpoints" / ".tmp-*"))
    trained = [line for line in _log(tmp_path) if not line.startswith("end")]
    assert len(trained) == at + 1  # stopped right after the step the signal came in
    # The resumed job is given no seed: the order must come from the checkpoint, not from this run.
    second = _run(tmp_path, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert _log(tmp_path) == _log(uninterrupted)  # (epoch, batch, learning rate) per step, and epoch losses
    assert np.array_equal(_weights(tmp_path), _weights(uninterrupted))


def test_a_step_checkpoint_is_written_inside_the_epoch_and_names_its_batch(tmp_path):
    first = _run(tmp_path, "--seed", 7, "--signal-at", 13)
    assert first.returncode == 75, first.stderr[-3000:]
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert "epoch-0002-batch-0004.keras" in names, names
    assert "after batch 4 of epoch 2" in first.stdout


def test_with_worker_processes_the_preempted_job_leaves_no_process_segment_or_temp_dir(uninterrupted, tmp_path,
                                                                                         short_tmp_path):
    tmp = short_tmp_path  # TMPDIR: the fork server's socket lives under it
    proc = subprocess.Popen([sys.executable, SCRIPT, str(tmp_path), "--seed", "7", "--signal-at", "14", "--processes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, "TMPDIR": str(tmp)},
                            cwd=REPO)
    descendants = set()
    try:
        while proc.poll() is None:
            try:
                descendants.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 75, err[-3000:]
    _, alive = psutil.wait_procs(list(descendants), timeout=10)
    assert not alive, alive
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"kfast_{proc.pid}_")]
    assert not glob.glob(str(tmp / "pymp-*"))
    second = _run(tmp_path, "--resume", "--processes")
    assert second.returncode == 0, second.stderr[-3000:]
    assert _log(tmp_path) == _log(uninterrupted)
    assert np.array_equal(_weights(tmp_path), _weights(uninterrupted))


def test_sigterm_during_a_stuck_batch_ends_within_the_bound_without_a_checkpoint(tmp_path, short_tmp_path):
    marker, tmp = tmp_path / "stuck", short_tmp_path  # TMPDIR: the fork server's socket lives under it
    proc = subprocess.Popen([sys.executable, SCRIPT, str(tmp_path), "--seed", "7", "--processes", "--stuck-at", "3",
                             "--marker", str(marker), "--timeout", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**ENV, "TMPDIR": str(tmp)},
                            cwd=REPO)
    try:
        wait_for_file(proc, marker, 120)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        before = sorted(os.listdir(tmp_path / "checkpoints")) if (tmp_path / "checkpoints").exists() else []
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert 2.5 < took < 10, (took, err[-2000:])
    assert "could not finish the current training step within 3 s" in err, err[-2000:]
    _, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, alive
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"kfast_{proc.pid}_")]
    assert not glob.glob(str(tmp / "pymp-*"))
    after = sorted(os.listdir(tmp_path / "checkpoints")) if (tmp_path / "checkpoints").exists() else []
    assert after == before and not [n for n in after if n.startswith(".tmp-")]


# -- two ranks under horovodrun -------------------------------------------------------------------------

TWO_STEPS = STEPS // 2  # each rank's shard of the 10 batches


@pytest.fixture(scope="module")
def uninterrupted_two(tmp_path_factory):
    from helpers import _horovodrun

    directory = tmp_path_factory.mktemp("uninterrupted_two")
    _horovod(_horovodrun(), directory, "--seed", 7)
    return directory


def _horovod(horovodrun, directory, *args, stopped=False, np=2):
    """Runs the script under horovodrun; returns its output lines, each with the time it was read (horovodrun's
    own lines come unbuffered: PYTHONUNBUFFERED)."""
    cmd = [horovodrun, "-np", str(np), "-H", f"localhost:{np}", "--gloo", sys.executable, SCRIPT, str(directory),
           *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO,
                            start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend((time.time(), line) for line in proc.stdout), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
        proc.stdout.close()
    output = "".join(line for _, line in lines)
    if not stopped:
        assert proc.returncode == 0, output[-4000:]
    else:
        assert proc.returncode != 0, output[-4000:]
        assert_stopped_resumably(output, np)
    return lines


def _steps(directory, rank):
    return [tuple(line.split()[:2]) for line in _log(directory, rank) if not line.startswith("end")]


@pytest.mark.parametrize("at", [3, TWO_STEPS + 2])
def test_two_ranks_stop_after_the_same_step_when_one_gets_the_signal_and_resume_identically(
        uninterrupted_two, tmp_path, at):
    from helpers import _horovodrun

    lines = _horovod(_horovodrun(), tmp_path, "--seed", 7, "--signal-at", at, "--signal-rank", 1, "--slow-exit", 2,
                     stopped=True)
    # Rank 1's clean-ups take 2 s more than rank 0's, yet rank 0 ends after them: horovodrun stops the other
    # ranks once one ended, through their shells, so a rank ending on its own later was listed as killed (143).
    cleaned = float((tmp_path / "cleaned-1.txt").read_text())
    # Anywhere in a line: horovodrun's threads share its output, and a rank's forwarded line can run into it.
    rank0_ended = [when for when, line in lines if "Process 0 exit with status code" in line]
    output = "".join(text for _, text in lines)
    assert rank0_ended and rank0_ended[0] >= cleaned, (rank0_ended, cleaned, output[-4000:])
    # Rank 1 alone was signalled; rank 0 stopped after the very same step. The note rides in the gradients'
    # allreduce of the step after the signal, so both trained that one step more.
    assert len(_steps(tmp_path, 0)) == len(_steps(tmp_path, 1)) == at + 2
    _horovod(_horovodrun(), tmp_path, "--resume")
    for rank in (0, 1):
        assert _log(tmp_path, rank) == _log(uninterrupted_two, rank), rank
        assert np.array_equal(_weights(tmp_path, rank), _weights(uninterrupted_two, rank))
    assert np.array_equal(_weights(tmp_path, 0), _weights(tmp_path, 1))


def test_a_two_rank_checkpoint_resumed_on_one_rank_trains_each_remaining_batch_of_the_epoch_once(tmp_path):
    from helpers import _horovodrun

    at = TWO_STEPS + 1  # the signal after epoch 2's second step; the ranks stop after its third
    _horovod(_horovodrun(), tmp_path, "--seed", 7, "--signal-at", at, stopped=True)
    before = {rank: _steps(tmp_path, rank) for rank in (0, 1)}
    for rank in (0, 1):
        os.rename(tmp_path / f"log-{rank}.txt", tmp_path / f"before-{rank}.txt")
    alone = _run(tmp_path, "--resume")
    assert alone.returncode == 0, alone.stderr[-3000:]
    after = _steps(tmp_path, 0)
    epoch_1 = [i for e, i in before[0] + before[1] + after if e == "1"]
    assert sorted(epoch_1) == sorted(str(i) for i in range(STEPS)), epoch_1  # every batch once, none twice
    assert len([1 for e, _ in before[0] if e == "1"]) == 3
    assert len([1 for e, _ in after if e == "1"]) == STEPS - 2 * 3
    assert sorted(i for e, i in after if e == "2") == sorted(str(i) for i in range(STEPS))


def test_a_packed_dataset_stopped_on_two_ranks_resumes_on_one_with_every_sample_of_the_epoch_once(tmp_path):
    # Issue 48: the samples of a batch follow the pack's permutation, keyed by the dataset's seed (5 in the first
    # run, 3 given to the resumed one: the checkpoint must put 5 back). Each batch's first sample id is logged.
    from helpers import _horovodrun

    import kfast

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 4, 3)).astype("float32")
    y = np.stack([x.sum(1), np.arange(len(x))], 1).astype("float32")
    packed = kfast.data.pack((x, y), str(tmp_path / "pack"), shard_size=8, verbose=0)
    at = TWO_STEPS + 1
    _horovod(_horovodrun(), tmp_path, "--seed", 7, "--signal-at", at, "--packed", packed, stopped=True)
    before = {rank: _steps(tmp_path, rank) for rank in (0, 1)}
    for rank in (0, 1):
        os.rename(tmp_path / f"log-{rank}.txt", tmp_path / f"before-{rank}.txt")
    alone = _run(tmp_path, "--resume", "--packed", packed)
    assert alone.returncode == 0, alone.stderr[-3000:]
    after = _steps(tmp_path, 0)
    # Epoch 1's batches, named by their first sample: with seed 5 these are the first samples of its 10 batches.
    data = kfast.data.PackedDataset(packed, batch_size=4, seed=5)
    data.set_epoch(1)
    firsts = sorted(str(data.indices(b)[0]) for b in range(STEPS))
    epoch_1 = [i for e, i in before[0] + before[1] + after if e == "1"]
    assert sorted(epoch_1) == firsts, (epoch_1, firsts)  # every batch once, none twice, the recorded permutation
    assert len([1 for e, _ in after if e == "1"]) == STEPS - 2 * 3
