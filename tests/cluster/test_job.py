"""The job `kfast launch` runs (kfast.cluster.job): the ranks' resumable stop comes out as status 75, and a stop
signal sent to kfast launch reaches its ranks. Real horovodrun, 2 ranks on this machine."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import REPO

pytestmark = pytest.mark.distributed  # kfast launch -np 2: real horovodrun

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
SCRIPT = os.path.join(REPO, "tests", "distributed", "preempt_script.py")


def _start(tmp_path, *args):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen([KFAST, "launch", "-np", "2", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env={**clean, "TF_CPP_MIN_LOG_LEVEL": "3"},
                            start_new_session=True)
    # Both pipes read by threads of their own: communicate() would read stderr too and take lines from `err`.
    out, err = [], []
    readers = [threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),
               threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    return proc, err, readers


def _finish(proc, readers, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"kfast launch still ran after {timeout} s")
    for reader in readers:
        reader.join(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout(240)
def test_ranks_that_stop_resumably_make_kfast_launch_exit_75(tmp_path):
    proc, err, readers = _start(tmp_path, SCRIPT, str(tmp_path), "--seed", "3", "--signal-at", "4")
    _finish(proc, readers, 200)
    assert proc.returncode == 75, "".join(err)[-3000:]
    assert "kfast launch: the ranks stopped with a checkpoint (status 75); run the same command with --resume" \
        in "".join(err)
    # 5 steps per rank and epoch: SIGTERM after step 4 (0-based), agreed in step 5's gradients.
    assert "epoch-0002-batch-0001.keras" in os.listdir(tmp_path / "checkpoints")


@pytest.mark.timeout(240)
def test_a_stop_signal_to_kfast_launch_stops_every_rank_with_a_checkpoint(tmp_path):
    marker = tmp_path / "held"
    proc, err, readers = _start(tmp_path, "--stop-signal", "SIGUSR1", SCRIPT, str(tmp_path), "--seed", "3",
                               "--hold-at", "12", "--marker", str(marker))
    deadline = time.monotonic() + 150
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "".join(err)[-3000:]
    proc.send_signal(signal.SIGUSR1)
    said = "kfast launch: SIGUSR1 received; sending SIGTERM to the 2 rank(s) on this host"
    while not any(said in line for line in err) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the ranks' watchers note SIGTERM at once; the held rank then trains on
    (tmp_path / "held.go").touch()
    _finish(proc, readers, 120)
    assert proc.returncode == 75, "".join(err)[-3000:]
    # Held after step 12 (the third epoch's third): step 13 carries the note, every rank stops after it.
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.keras", "epoch-0002.keras",
                                                            "epoch-0003-batch-0004.keras"]
    logs = [(tmp_path / f"log-{r}.txt").read_text().splitlines() for r in (0, 1)]
    assert len(logs[0]) == len(logs[1]) == 14 + 2  # 14 steps, 2 epoch ends
