"""Training across hosts that share no files: real horovodrun over real ssh, on the namespace harness.

Every host has its own disk at the same path (harness.HOST_DIR); the test writes the user's files to each
host's copy, as a user copies a project to every machine, and reads each host's disk from outside.
"""

import json
import os
import re

import pytest

import harness
from runner import ALLREDUCE, horovodrun
from helpers import README_DATASET, rank_lines, readme_scale_out_snippet
from kfast._core import tf_noise

WORK = f"{harness.HOST_DIR}/work"

MY_PROJECT = '''
import json

import keras
import numpy as np

import kfast


def build_model():
    # Each rank starts from its own weights: BroadcastState must make them equal.
    keras.utils.set_random_seed(100 + kfast.distributed.rank())
    model = keras.Sequential([
        keras.Input((10, 10, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    with open(f"initial-rank{kfast.distributed.rank()}.json", "w") as f:
        json.dump([np.asarray(w).tolist() for w in model.get_weights()], f)
    return model
''' + README_DATASET

REPORT = '''
import json, numpy as np
inner = model.optimizer.inner_optimizer
with open(f"report-rank{kfast.distributed.rank()}.json", "w") as f:
    json.dump({"initial_epoch": initial_epoch, "size": kfast.distributed.size(),
               "state": [np.asarray(v).tolist() for v in model.weights + inner.variables]}, f)
'''


def _json(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", ["hostA:1,hostB:1", "hostA:1,hostB:1,hostC:1"])
def test_allreduce_across_hosts_is_exact(cluster, hosts):
    out = horovodrun(cluster, hosts, ALLREDUCE, timeout=100)
    n = len(hosts.split(","))
    lines = rank_lines(out, "allreduce sum")
    assert sorted(lines) == list(range(n)), out
    expected = [n * (n + 1) / 2, 10 * n * (n + 1) / 2]
    for rank, line in lines.items():
        assert line == f"rank {rank}/{n}: allreduce sum {expected}, expected {expected}: OK", out


@pytest.mark.timeout(240)
def test_readme_scale_out_on_two_hosts_ends_identical_and_resumes_from_the_chiefs_disk(cluster):
    snippet = readme_scale_out_snippet()
    for name in ("hostA", "hostB"):
        with open(cluster.path(name, "work", "my_project.py"), "w") as f:
            f.write(MY_PROJECT)
        with open(cluster.path(name, "work", "train.py"), "w") as f:
            f.write(snippet + REPORT)
    train = f"{WORK}/train.py"

    horovodrun(cluster, "hostA:1,hostB:1", train, timeout=200)
    initial = [_json(cluster.path(name, "work", f"initial-rank{rank}.json"))
               for rank, name in enumerate(("hostA", "hostB"))]
    assert initial[0] != initial[1]  # the ranks started apart
    first = [_json(cluster.path(name, "work", f"report-rank{rank}.json")) for rank, name in enumerate(("hostA", "hostB"))]
    assert [r["initial_epoch"] for r in first] == [0, 0] and first[0]["size"] == 2
    assert first[0]["state"] == first[1]["state"]  # weights and SGD state, bit for bit
    ckpt = cluster.path("hostA", "work", "ckpt")
    assert sorted(os.listdir(ckpt)) == ["best.keras", "epoch-0008.keras", "epoch-0009.keras", "epoch-0010.keras"]
    assert not os.path.exists(cluster.path("hostB", "work", "ckpt"))  # only the chief writes, on its own disk

    # Interrupted after epoch 8: hostB has no checkpoint, rank 0 reads hostA's and broadcasts it.
    for name in ("epoch-0009.keras", "epoch-0010.keras"):
        os.remove(os.path.join(ckpt, name))
    horovodrun(cluster, "hostA:1,hostB:1", train, timeout=200)
    second = [_json(cluster.path(name, "work", f"report-rank{rank}.json")) for rank, name in enumerate(("hostA", "hostB"))]
    assert [r["initial_epoch"] for r in second] == [8, 8]
    assert second[0]["state"] == second[1]["state"]
    assert sorted(os.listdir(ckpt)) == ["best.keras", "epoch-0008.keras", "epoch-0009.keras", "epoch-0010.keras"]
    assert not os.path.exists(cluster.path("hostB", "work", "ckpt"))


def _losses(stdout):
    return [float(v) for v in re.findall(r" - loss: ([0-9.e+-]+)", stdout)]


@pytest.mark.timeout(200)
def test_kfast_launch_tabular_on_two_hosts(cluster):
    cmd = ["kfast", "launch", "-np", "2", "-H", "hostA:1,hostB:1", "tabular", "--epochs", "2", "--workers", "1",
           "--samples", "1024", "--checkpoint-dir", "launch-ckpt"]
    proc = cluster.run("hostA", cmd, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kfast launch: Gloo will use eth0, the one network interface every host has." in proc.stdout
    assert "kfast recipe tabular: 2 rank(s)" in proc.stdout
    losses = _losses(proc.stdout)
    assert len(losses) == 2 and losses[1] < losses[0], proc.stdout  # rank 0 alone prints
    assert sorted(os.listdir(cluster.path("hostA", "work", "launch-ckpt"))) == [
        "best.keras", "epoch-0001.keras", "epoch-0002.keras"]
    assert not os.path.exists(cluster.path("hostB", "work", "launch-ckpt"))
    # The ranks' TensorFlow start-up lines never reach the user: what is left is this launcher's own import
    # of TensorFlow (two "oneDNN" lines; every process prints them twice), which happens before kfast runs.
    assert sum("oneDNN custom operations are on" in line for line in proc.stderr.splitlines()) <= 2, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if tf_noise.is_noise(line) and "]<std" in line]
