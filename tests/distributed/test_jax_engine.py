"""kfast.distributed on Keras's JAX backend: Keras's own distribution over virtual CPU devices and JAX processes.

Runs in .venv-jax (no TensorFlow), under `make test-backends`; tests/conftest.py collects it only there. Every
job is tests/distributed/jax_job.py, in a fresh process whose device count XLA_FLAGS sets.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "jax_job.py")
KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
RESUMABLE = 75


def _env(devices):
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")])))
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID"):
        env.pop(name, None)
    return env


def _run(directory, *args, devices=1, processes=1, expect=0):
    os.makedirs(directory, exist_ok=True)
    if processes == 1:
        cmd = [sys.executable, JOB, str(directory), *args]
    else:
        cmd = [KFAST, "launch", "-np", str(processes), JOB, str(directory), *args]
    proc = subprocess.run(cmd, env=_env(devices), capture_output=True, text=True, timeout=240)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _weights(directory, rank=0):
    return np.load(os.path.join(directory, f"weights-{rank}.npy"))


def _facts(directory, rank=0):
    with open(os.path.join(directory, f"facts-{rank}.json")) as f:
        return json.load(f)


def _steps(directory, rank):
    with open(os.path.join(directory, f"log-{rank}.txt")) as f:
        return [line.split() for line in f.read().splitlines()]


def test_the_collectives_carry_objects_and_exact_float64_between_processes(tmp_path):
    proc = subprocess.run([KFAST, "launch", "-np", "2", os.path.join(HERE, "jax_collectives.py")], env=_env(2),
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = _reports(proc.stdout)
    assert [(r["rank"], r["size"], r["local"], r["chief"]) for r in reports] == [(0, 2, [0, 2], True),
                                                                                (1, 2, [1, 2], False)]
    for r in reports:
        assert r["gathered"] == [{"rank": 0, "text": "x" * 10}, {"rank": 1, "text": "x" * 1010}]
        assert r["broadcast"] == ["from", 1, [0, 1, 2]]
        assert r["sums"] == [0.1 + 0.2, 2e-300, 2.0 ** 61 + 1]  # float64 as Python adds them, not float32
        assert r["means"] == [0.5, 3.0] and r["average"] == [0.5, 0.5]
        # A broadcast moves one copy: the length (8 bytes), then the N pickled bytes, from either root; an
        # all-gather of every process's bytes would hand each process N x 2.
        for root in ("0", "1"):
            b = r["broadcasts"][root]
            assert b["exact"] and b["moved"] == [["broadcast_one_to_all", 8], ["broadcast_one_to_all", b["pickled"]]]
        # The vote: one all-gather of 3 int32 per process, and the signal process 1 noted, named on both.
        assert r["maximum"] == [[5, 7, 0], [["process_allgather", 2 * 3 * 4]]]
        assert r["votes"][0] == [None, [["process_allgather", 24]]]
        assert r["votes"][1] == [["SIGTERM on another rank", "SIGTERM"][r["rank"]], [["process_allgather", 24]]]
        # An uneven split would leave one process waiting for ever in its extra step: both say why instead.
        assert r["uneven"] == ("FastLoader got a dataset of 5 batches to evaluate or predict on over 2 JAX processes; "
                               "each step is one program over all of them, so every process needs as many batches, all "
                               "full: give it a multiple of 2 batches (with batches of B samples, a multiple of 2 x B "
                               "samples).")
        assert r["elastic"].startswith("elastic_fit() needs the Horovod engine (Keras on TensorFlow)")
        assert r["predict_arrays"].startswith("kfast.distributed.predict over 2 JAX processes got ndarray; it reads a "
                                         "kfast.data.FastLoader")
        rows = np.stack([np.arange(48), np.arange(48) % 7], 1)
        assert r["predicted"] == (rows @ [1.0, 1000.0] + 0.5).tolist()  # the whole set, in order, on each process


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The reference: one process, one device, batches of 16, the rate two processes of 8 reach (0.02 x 2)."""
    directory = tmp_path_factory.mktemp("one-device")
    _run(directory, "--batch", "16", "--lr", "0.04", "--warmup-epochs", "0")
    return directory


def test_one_process_with_eight_devices_trains_data_parallel_as_one_device_does(tmp_path, one_device):
    _run(tmp_path, "--batch", "16", "--lr", "0.04", "--warmup-epochs", "0", devices=8)
    facts = _facts(tmp_path)
    assert (facts["size"], facts["devices"], facts["mesh"]) == (1, 8, {"batch": 8})
    assert facts["kernel_spec"] == [None, None]  # replicated: each device holds the whole kernel
    np.testing.assert_allclose(_weights(tmp_path), _weights(one_device), atol=1e-5)


def test_model_parallel_over_a_2x4_mesh_splits_the_kernel_and_checkpoints_the_whole_model(tmp_path, one_device):
    import keras

    _run(tmp_path, "--batch", "16", "--lr", "0.04", "--warmup-epochs", "0", "--model-parallel", devices=8)
    facts = _facts(tmp_path)
    assert facts["mesh"] == {"data": 2, "model": 4} and facts["devices"] == 8
    assert facts["kernel_spec"] == [None, "model"]  # the hidden kernel's 16 columns, 4 on each model shard
    np.testing.assert_allclose(_weights(tmp_path), _weights(one_device), atol=1e-5)
    # The last step checkpoint is the whole trained model, in a file plain Keras opens on one device.
    last = keras.saving.load_model(tmp_path / "checkpoints" / "epoch-0002-batch-0006.keras", compile=False)
    assert [tuple(w.shape) for w in last.get_weights()] == [(6, 16), (16,), (16, 1), (1,)]
    np.testing.assert_array_equal(np.concatenate([w.ravel() for w in last.get_weights()]), _weights(tmp_path))


def test_two_processes_through_kfast_launch_train_as_one_process_with_four_devices(tmp_path, one_device):
    four = tmp_path / "four"
    _run(four, "--batch", "16", "--lr", "0.04", "--warmup-epochs", "0", devices=4)
    two = tmp_path / "two"
    out = _run(two, "--batch", "8", "--warmup-epochs", "0", devices=2, processes=2)
    assert "kfast.cluster.jax_processes -np 2" in out.stdout
    assert [_facts(two, r)["size"] for r in (0, 1)] == [2, 2] and _facts(two)["devices"] == 4
    np.testing.assert_array_equal(_weights(two, 0), _weights(two, 1))  # one global array: identical copies
    np.testing.assert_allclose(_weights(two), _weights(four), atol=1e-5)  # 2 processes x 8 == 1 x 16
    np.testing.assert_allclose(_weights(four), _weights(one_device), atol=1e-5)
    # Only process 0 writes checkpoints (an audit hook in each process saw its own writes).
    assert (two / "writes-0.txt").read_text() and not (two / "writes-1.txt").read_text()
    assert "epoch-0002-batch-0006.keras" in os.listdir(two / "checkpoints")


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_to_one_process_stops_every_process_after_the_same_step_and_the_resume_matches(tmp_path, processes):
    shape = ["--batch", str(16 // processes), "--shuffle", "--epochs", "3"]
    devices = 2 if processes == 2 else 1
    whole = tmp_path / "whole"
    _run(whole, *shape, devices=devices, processes=processes)
    cut = tmp_path / "cut"
    out = _run(cut, *shape, "--signal-at", "7", "--signal-rank", str(processes - 1), devices=devices,
               processes=processes, expect=RESUMABLE)
    assert "the checkpoint is " + str(cut / "checkpoints" / "epoch-0002-batch-0002.keras") in out.stdout + out.stderr
    assert [len(_steps(cut, r)) for r in range(processes)] == [8] * processes  # the same step on every process
    _run(cut, *shape, "--resume", devices=devices, processes=processes)
    for r in range(processes):
        assert len(_steps(cut, r)) == len(_steps(whole, r)) == 18  # no batch trained twice, none left out
        np.testing.assert_array_equal(_weights(cut, r), _weights(whole, r))
        assert [s[2] for s in _steps(cut, r)] == [s[2] for s in _steps(whole, r)]  # the warm-up's rates too


MY_PROJECT = '''
import keras
import numpy as np


def build_model():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])


class MyDataset(keras.utils.PyDataset):
    def __init__(self, split):
        super().__init__()
        rng = np.random.default_rng(0 if split == "train" else 1)
        self.x = rng.normal(size=(64, 6)).astype("float32")
        self.y = (self.x[:, 0] > 0).astype("int32") + (self.x[:, 1] > 1).astype("int32")

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.x[8 * i:8 * i + 8], self.y[8 * i:8 * i + 8]
'''

REPORT = '''
import json
print("REPORT " + json.dumps({"rank": kfast.distributed.rank(), "size": kfast.distributed.size(),
                              "initial_epoch": initial_epoch, "val_loss": model.history.history.get("val_loss"),
                              "weights": [float(abs(w).sum()) for w in model.get_weights()]}), flush=True)
'''


def test_a_users_own_data_parallel_and_a_loader_read_every_batch_once_with_equal_steps(tmp_path):
    # Keras shards a PyDataset under its own multi-process DataParallel but passes a data adapter through: the
    # loader follows Keras's split (without kfast.distributed.init), or each process would read every batch.
    proc = subprocess.run([KFAST, "launch", "-np", "2", os.path.join(HERE, "jax_own_distribution.py")],
                          env=_env(1), capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = _reports(proc.stdout)
    assert [r["rank"] for r in reports] == [0, 1]
    assert sorted(reports[0]["serves"] + reports[1]["serves"]) == list(range(12))  # every batch once
    assert reports[0]["serves"] == [0, 2, 4, 6, 8, 10]
    assert reports[0]["steps"] == reports[1]["steps"] == 2 * 6  # two epochs of 6 steps on each process


def _reports(out):
    return sorted((json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines() if "REPORT " in line),
                  key=lambda r: r["rank"])


def test_the_guides_script_trains_on_two_processes_and_resumes(tmp_path):
    from helpers import doc_snippet

    snippet = doc_snippet("Scale out on JAX: Keras's own distribution")
    assert "kfast.distributed.init()" in snippet and "default_callbacks(\"ckpt\", loader=train)" in snippet
    (tmp_path / "my_project.py").write_text(MY_PROJECT)
    (tmp_path / "train.py").write_text(snippet + REPORT)
    env = dict(_env(2), PYTHONPATH=os.pathsep.join([str(tmp_path), _env(2)["PYTHONPATH"]]))
    cmd = [KFAST, "launch", "-np", "2", "train.py"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    reports = _reports(first.stdout)
    assert [(r["rank"], r["size"], r["initial_epoch"]) for r in reports] == [(0, 2, 0), (1, 2, 0)]
    assert reports[0]["weights"] == reports[1]["weights"] and reports[0]["val_loss"] == reports[1]["val_loss"]
    assert len(reports[0]["val_loss"]) == 10
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["best.keras", "epoch-0008.keras", "epoch-0009.keras",
                                                     "epoch-0010.keras"]
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = _reports(again.stdout)
    assert [r["initial_epoch"] for r in resumed] == [10, 10]
    assert resumed[0]["weights"] == reports[0]["weights"]  # the checkpoint's weights, nothing trained after


RECIPES = {"image-classification": ["--samples", "256", "--image-size", "16"], "tabular": ["--samples", "1024"],
           "text-classification": ["--samples", "768"]}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_trains_on_two_jax_processes(name, tmp_path):
    import re

    proc = subprocess.run([KFAST, "launch", "-np", "2", name, "--epochs", "2", "--workers", "1", *RECIPES[name]],
                          env=_env(1), cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[0] kfast recipe " + name + ": 2 rank(s)" in proc.stdout
    losses = [float(v) for v in re.findall(r"^\[0\] .* - loss: ([0-9.e+-]+)", proc.stdout, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0], proc.stdout  # process 0 alone prints
    assert not re.search(r"^\[1\] Epoch", proc.stdout, re.M)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]


def test_a_packed_dataset_stopped_on_two_processes_resumes_to_the_uninterrupted_weights(tmp_path):
    # Issue 48 on the JAX engine: the pack's permutation (seed 5) is saved with the loader's position; the resumed
    # job is given seed 3 and must train the uninterrupted run's samples in its order, to identical weights.
    shape = ["--batch", "8", "--packed", "--epochs", "3"]
    whole = tmp_path / "whole"
    _run(whole, *shape, devices=2, processes=2)
    cut = tmp_path / "cut"
    _run(cut, *shape, "--signal-at", "7", "--signal-rank", "1", devices=2, processes=2, expect=RESUMABLE)
    _run(cut, *shape, "--resume", devices=2, processes=2)
    for r in range(2):
        assert len(_steps(cut, r)) == len(_steps(whole, r))
        np.testing.assert_array_equal(_weights(cut, r), _weights(whole, r))
