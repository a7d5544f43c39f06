"""Every recipe, for real: on-disk sample data single-process with resume, and synthetic data on 2 ranks."""

import os
import re
import subprocess
import sys

import pytest

from kfast.cli import launch_command

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
SMALL = {"image-classification": ["--samples", "256", "--image-size", "16"],
         "tabular": ["--samples", "1024"],
         "text-classification": ["--samples", "768"]}
SAMPLE = {"image-classification": "images", "tabular": "data.csv", "text-classification": "texts"}


def kfast(*args, cwd, timeout=300):
    proc = subprocess.run([KFAST, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(cwd)})
    return proc


def losses(stdout):
    return [float(v) for v in re.findall(r" - loss: ([0-9.e+-]+)", stdout)]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_recipe_on_disk_sample_learns_checkpoints_and_resumes(name, tmp_path):
    sample = kfast("train", name, "--make-sample", SAMPLE[name], cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr
    assert os.path.exists(tmp_path / SAMPLE[name])
    args = ["train", name, "--data", SAMPLE[name], "--workers", "2", "--warmup-epochs", "0"]
    first = kfast(*args, "--epochs", "3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    got = losses(first.stdout)
    assert len(got) == 3 and got[-1] < got[0], first.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras",
                                                            "epoch-0003.keras"]
    resumed = kfast(*args, "--epochs", "4", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "Epoch 4/4" in resumed.stdout and "Epoch 3/4" not in resumed.stdout
    assert "epoch-0004.keras" in os.listdir(tmp_path / "checkpoints")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_recipe_trains_on_two_ranks(name, tmp_path):
    proc = kfast("launch", "-np", "2", name, "--epochs", "2", "--workers", "1", *SMALL[name], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rank(s)" in proc.stdout
    got = losses(proc.stdout)
    assert len(got) == 2 and got[1] < got[0], proc.stdout  # rank 0 alone prints
    assert "[1]<stdout>:Epoch" not in proc.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.keras", "epoch-0001.keras", "epoch-0002.keras"]


@pytest.mark.timeout(300)
def test_recipe_file_runs_under_horovodrun(horovodrun, tmp_path):
    out = horovodrun("recipes/tabular.py", "--epochs", "1", "--workers", "1", "--samples", "512",
                     "--checkpoint-dir", tmp_path / "ckpt")
    assert "kfast recipe tabular: 2 rank(s)" in out
    assert os.listdir(tmp_path / "ckpt")


def test_launch_builds_the_horovodrun_command():
    py = "/usr/bin/python3"
    assert launch_command(8, "host1:4,host2:4", None, "tabular", ["--epochs", "3"], python=py) == [
        "horovodrun", "-np", "8", "-H", "host1:4,host2:4", py, "-m", "kfast.cli", "train", "tabular", "--epochs", "3"]
    assert launch_command(2, None, None, "tabular", [], python=py)[:5] == ["horovodrun", "-np", "2", "-H", "localhost:2"]
    assert launch_command(4, None, "hosts.txt", "tabular", [], python=py)[3:5] == ["--hostfile", "hosts.txt"]
    for hosts, match in [("host1", "not a host list"), ("a:1,b", "not a host list"), ("a:1,b:2", "offers 3 slot"),
                         ("", "-H '' names no host"), (" ", "-H ' ' names no host")]:
        with pytest.raises(ValueError, match=match):
            launch_command(4, hosts, None, "tabular", [])


@pytest.mark.parametrize("args, message", [
    (["train", "nope"], "unknown recipe 'nope'; choose one of: image-classification, tabular"),
    (["train", "tabular", "--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["train", "tabular", "--save-freq", "0"], "--save-freq must be at least 1, got 0"),
    (["train", "tabular", "--preemption-signal", "SIGBOGUS"],
     "RankZeroCheckpoint got the signal 'SIGBOGUS', which this system does not have"),
    (["train", "tabular", "--data", "missing.csv"], "--data 'missing.csv' does not exist"),
    (["train", "tabular", "--bogus"], "unrecognized arguments: --bogus"),
    (["launch", "-np", "2", "-H", "host1", "tabular"], "-H 'host1' is not a host list"),
    (["launch", "-np", "2", "nope"], "unknown recipe 'nope'"),
])
def test_bad_recipe_names_and_flags_fail_clearly(args, message, tmp_path):
    proc = kfast(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_recipes_lists_every_recipe(tmp_path):
    proc = kfast("recipes", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0
    for name in SMALL:
        assert f"  {name} " in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_image_recipe_trains_on_packed_shards_and_says_so(tmp_path):
    assert kfast("train", "image-classification", "--make-sample", "imgs", cwd=tmp_path).returncode == 0
    packed = kfast("pack", "imgs", "packed", "--shard-size", "20", cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    run = kfast("train", "image-classification", "--data", "packed", "--epochs", "3", "--workers", "2",
                "--warmup-epochs", "0", "--batch-size", "16", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--data packed: packed shards, 96 samples in 5 shard(s), 4 classes" in run.stdout
    got = losses(run.stdout)
    assert len(got) == 3 and got[-1] < got[0], run.stdout
