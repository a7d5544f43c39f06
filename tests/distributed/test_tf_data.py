"""tf.data under Horovod (issue 25): one call shards an image_dataset_from_directory pipeline with equal
steps on every rank; unequal step counts fail before the first step naming both; evaluate is global."""

import json
import os

import numpy as np
import pytest

from helpers import rank_lines

SCRIPT = "tests/distributed/tf_data_script.py"


def image_folder(root, per_class=9, seed=0):
    """Two classes of small JPEGs (the second brighter, so there is something to learn)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label, name in enumerate(["cats", "dogs"]):
        os.makedirs(root / name)
        for i in range(per_class):
            pixels = rng.integers(0, 128, size=(20, 20, 3)) + 100 * label
            Image.fromarray(pixels.astype("uint8")).save(root / name / f"{i}.jpg")
    return root


@pytest.fixture(scope="module")
def job(horovodrun_module, tmp_path_factory):
    """One horovodrun job for both tests: the sharded fit, then the mismatched step counts. Returns the
    folder the ranks wrote to and the job's output."""
    out = tmp_path_factory.mktemp("tf_data")
    return out, horovodrun_module(SCRIPT, "fit,mismatch", out, image_folder(out / "images"))


def test_a_sharded_image_pipeline_trains_equal_steps_to_identical_weights_and_evaluates_globally(job):
    out, _ = job
    ranks = []
    for r in (0, 1):
        with open(out / f"fit-rank{r}.json") as f:
            ranks.append(json.load(f))
    assert ranks[0]["batches"] == 5  # 18 images in batches of 4: the odd batch is dropped for training
    assert ranks[0]["steps"] == ranks[1]["steps"] == [2, 2]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    # evaluate over each rank's shard (mode="all": 3 and 2 batches, 10 and 8 images) == one process on all.
    assert ranks[0]["evaluate"] == ranks[1]["evaluate"]
    assert ranks[0]["alone"] == pytest.approx(ranks[1]["alone"], rel=1e-6)
    for name in ("loss", "accuracy", "auc", "mean_prediction"):
        assert ranks[0]["evaluate"][name] == pytest.approx(ranks[0]["alone"][name], rel=1e-5, abs=1e-6), name
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"]
    assert ranks[0]["val_loss"][-1] == pytest.approx(ranks[0]["alone"]["loss"], rel=1e-5)


def test_unequal_steps_fail_before_the_first_step_naming_every_count(job):
    _, out = job
    for r in (0, 1):
        cases = {line.split(":")[0].removeprefix("CASE "): line for line in out.splitlines()
                 if f"[{r}]<stdout>:CASE " in line for line in [line.split("]<stdout>:", 1)[1]]}
        assert set(cases) == {"tf.data", "PyDataset", "generator", "unseeded"}, out[-3000:]
        assert "rank 0: 3; rank 1: 2" in cases["tf.data"], cases["tf.data"]
        assert "rank 0: 3; rank 1: 4" in cases["PyDataset"], cases["PyDataset"]
        assert "ranks 0, 1 of 2 cannot say how many steps" in cases["generator"], cases["generator"]
        assert "rank 0 and rank 1 read different first batches" in cases["unseeded"], cases["unseeded"]
        for name in ("tf.data", "PyDataset", "generator"):
            seconds = float(cases[name].split("after ")[1].split(" s")[0])
            assert seconds < 20, cases[name]  # before the first step, not at a collective's time-out
