"""README's scale-out snippet, taken from README.md itself, runs under horovodrun and resumes.

The user's module is Horovod's MNIST example structure (a Sequential without an Input layer); the test
appends a few lines that write what each rank ended with.
"""

import json
import os

import numpy as np

from helpers import README_DATASET, readme_scale_out_snippet

MY_PROJECT = '''
import keras
import numpy as np


def build_model():
    return keras.Sequential([
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
''' + README_DATASET

REPORT = '''
import json, numpy as np
from kfast.distributed import checkpoint
inner = model.optimizer.inner_optimizer
with open(f"report-rank{kfast.distributed.rank()}.json", "w") as f:
    json.dump({"initial_epoch": initial_epoch, "size": kfast.distributed.size(),
               "lr": float(keras.ops.convert_to_numpy(inner.learning_rate)),
               "state": [np.asarray(v).tolist() for v in model.weights + inner.variables]}, f)
'''


def _reports(path):
    out = []
    for rank in (0, 1):
        with open(path / f"report-rank{rank}.json") as f:
            out.append(json.load(f))
    return out


def test_readme_scale_out_snippet_trains_and_resumes_on_two_ranks(horovodrun, tmp_path):
    snippet = readme_scale_out_snippet()
    assert "kfast.distributed.restore(model" in snippet and "build_model()" in snippet
    (tmp_path / "my_project.py").write_text(MY_PROJECT)
    (tmp_path / "train.py").write_text(snippet + REPORT)
    train = str(tmp_path / "train.py")

    horovodrun(train, cwd=tmp_path, timeout=300)
    first = _reports(tmp_path)
    assert [r["initial_epoch"] for r in first] == [0, 0] and first[0]["size"] == 2
    assert first[0]["state"] == first[1]["state"]  # weights and SGD state, bit for bit
    assert first[0]["lr"] == first[1]["lr"] == np.float32(0.02)  # 0.01 x 2 ranks after the warm-up
    ckpt = tmp_path / "ckpt"
    assert sorted(os.listdir(ckpt)) == ["best.keras", "epoch-0008.keras", "epoch-0009.keras", "epoch-0010.keras"]

    # Interrupted after epoch 8: the same command resumes there, at the same rates.
    for name in ("epoch-0009.keras", "epoch-0010.keras"):
        os.remove(ckpt / name)
    horovodrun(train, cwd=tmp_path, timeout=300)
    second = _reports(tmp_path)
    assert [r["initial_epoch"] for r in second] == [8, 8]
    assert second[0]["state"] == second[1]["state"]
    assert second[0]["lr"] == np.float32(0.02)
