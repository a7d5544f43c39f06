"""Real two-rank Horovod training (horovodrun -np 2 --gloo on CPU) with exact expectations."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

SCRIPT = "tests/distributed/train_script.py"
# The modes that end normally, all in one job (train_modes.py); a killed rank and the resume after it have
# jobs of their own.
SHARED_MODES = ["sync", "nosync", "equiv", "equiv_spe", "equiv_accum", "equiv_fp16", "uneven", "full",
                "warmup_resume", "plain_resume"]
SHARED_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def shared(horovodrun_module, tmp_path_factory):
    """The folder where one horovodrun job ran every mode of SHARED_MODES, each writing <mode>-rank<r>.json."""
    out = tmp_path_factory.mktemp("shared")
    horovodrun_module("tests/distributed/train_modes.py", out, *SHARED_MODES, timeout=SHARED_TIMEOUT_S)
    return out


def _results(out, mode):
    results = []
    for r in (0, 1):
        with open(os.path.join(out, f"{mode}-rank{r}.json")) as f:
            results.append(json.load(f))
    return results


def test_ranks_end_bit_identical_only_with_distributed_optimizer(shared):
    rank0, rank1 = _results(shared, "sync")
    assert rank0["state"] == rank1["state"]  # weights and Adam's state, bit for bit
    rank0, rank1 = _results(shared, "nosync")
    assert rank0["state"] != rank1["state"]  # the check above can fail


@pytest.mark.parametrize("mode", ["equiv", "equiv_spe", "equiv_accum"])
def test_two_ranks_of_batch_b_match_one_rank_of_batch_2b(shared, mode):
    rank0, rank1 = _results(shared, mode)
    assert rank0["weights"] == rank1["weights"]
    for got, want in zip(rank0["weights"], rank0["reference"]):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_fp16_compression_across_two_ranks_stays_within_fp16_tolerance(shared):
    rank0, rank1 = _results(shared, "equiv_fp16")
    assert rank0["weights"] == rank1["weights"]
    for got, want in zip(rank0["weights"], rank0["reference"]):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=2e-3)
    # fp16 really travelled: the result is not the fp32 one bit for bit.
    assert any(not np.array_equal(got, want) for got, want in zip(rank0["weights"], rank0["reference"]))


def _warmup_rates(size, epochs=6, warmup=5, steps=3, base=0.05):
    return [base * (1 + min(1.0, (e + (b + 1) / steps) / warmup) * (size - 1)) for e in range(epochs)
            for b in range(steps)]


def test_resume_at_every_epoch_of_the_warmup_gives_the_uninterrupted_rates(shared, tmp_path):
    rank0, rank1 = _results(shared, "warmup_resume")
    assert rank0["uninterrupted"] == rank1["uninterrupted"]
    np.testing.assert_allclose(rank0["uninterrupted"], _warmup_rates(2), rtol=0, atol=1e-7)
    for stop, resumed in rank0["resumed"].items():
        assert resumed["initial_epoch"] == int(stop)
        np.testing.assert_allclose(resumed["rates"], rank0["uninterrupted"], rtol=0, atol=1e-7, err_msg=stop)
        for got, want in zip(resumed["state"], rank0["final"]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=stop)
        assert resumed["state"] == rank1["resumed"][stop]["state"]

    # The run stopped after 2 epochs on 2 ranks, resumed on 1: the same base rate, scaled by 1 (in a copy of
    # the stopped checkpoints, which the other tests' shared folder keeps as they were).
    shutil.copytree(shared / "ckpt-2-stopped", tmp_path / "ckpt-2-stopped")
    proc = subprocess.run([sys.executable, SCRIPT, "resume_one_rank", str(tmp_path)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(tmp_path, "resume_one_rank-rank0.json")) as f:
        one = json.load(f)
    assert one["initial_epoch"] == 2
    np.testing.assert_allclose(one["rates"], [0.05] * (4 * 3), rtol=0, atol=1e-9)


def test_uneven_dataset_trains_to_the_end_and_metrics_average_exactly(shared):
    for result in _results(shared, "uneven"):
        assert result["loader_len"] == 3  # 7 batches over 2 ranks, mode "drop"
        assert result["steps"] == 6  # 2 epochs, same count on both ranks
        assert result["averaged"] == {"loss": 0.5, "val_acc": 5.0, "name": "text"}


def test_killed_rank_ends_the_job_and_resume_matches_an_uninterrupted_run(horovodrun, shared, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (uninterrupted, _) = _results(shared, "full")
    assert uninterrupted["files"] == ["best.keras", "epoch-0002.keras", "epoch-0003.keras", "epoch-0004.keras"]

    start = time.monotonic()
    out = horovodrun(SCRIPT, "killed", broken, expect_fail=True, timeout=120)
    assert time.monotonic() - start < 90
    assert "Exit code: 17" in out or "exit code 17" in out.lower(), out
    # Rank 0 may be stopped halfway through saving epoch 3: only its partial file (removed on resume) may
    # stand beside the complete checkpoints.
    left = sorted(os.listdir(broken / "ckpt"))
    assert [n for n in left if not n.startswith(".tmp-")] == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]
    assert not [p for p in psutil.process_iter(["cmdline"]) if SCRIPT in " ".join(p.info["cmdline"] or [])]

    horovodrun(SCRIPT, "resumed", broken)
    assert not [n for n in os.listdir(broken / "ckpt") if n.startswith(".tmp-")]
    rank0, rank1 = _results(broken, "resumed")
    assert rank0["initial_epoch"] == rank1["initial_epoch"] == 2
    assert rank0["state"] == rank1["state"]
    for got, want in zip(rank0["state"], uninterrupted["state"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_checkpoint_and_model_save_load_without_kfast_or_horovod(shared, tmp_path):
    (trained, _) = _results(shared, "full")
    (resumed, _) = _results(shared, "plain_resume")
    state = tmp_path / "loaded.json"
    # A checkpoint of RankZeroCheckpoint, and the user's own model.save at the end of a 2-rank job.
    paths = [str(shared / "ckpt" / "epoch-0004.keras"), str(shared / "plain-resumed.keras")]
    code = ("import sys, json; sys.modules['kfast'] = sys.modules['horovod'] = None\n"
            "import keras, numpy as np\n"
            "out = []\n"
            f"for path in {paths!r}:\n"
            "    m = keras.saving.load_model(path)\n"
            "    s = [v.numpy().tolist() for v in m.weights] + [np.asarray(v.numpy()).tolist() for v in m.optimizer.variables]\n"
            "    out.append([type(m.optimizer).__name__, s])\n"
            f"json.dump(out, open({str(state)!r}, 'w'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr
    with open(state) as f:
        (checkpoint_optimizer, checkpoint_state), (saved_optimizer, saved_state) = json.load(f)
    assert checkpoint_optimizer == saved_optimizer == "Adam"
    assert checkpoint_state == trained["state"]  # weights and Adam's moments, as trained
    assert saved_state == resumed["state"]


def test_a_plain_keras_adam_checkpoint_goes_on_under_two_ranks_with_its_moments(shared):
    rank0, rank1 = _results(shared, "plain_resume")
    for result in (rank0, rank1):
        assert result["initial_epoch"] == 2
        assert result["warnings"] == []  # no "Skipping variable loading for optimizer": the state was loaded
        assert result["restored"] == rank0["saved"]  # weights, Adam's iterations and moments, bit for bit
    assert rank0["state"] == rank1["state"]
    # 2 ranks of batch B from the restored moments take the steps one process of batch 2B takes.
    for got, want in zip(rank0["weights"], rank0["reference"]):
        np.testing.assert_allclose(got, want, atol=1e-5)
