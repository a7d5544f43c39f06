"""README's single-process snippets (Quick start 1, and "Feed the GPU"), taken from README.md itself, run as
users would paste them after defining their model and data."""

import subprocess
import sys

from helpers import REPO, readme_snippet

# What a user has before the snippets: a compiled model and a dataset (a keras.utils.PyDataset).
PRELUDE = '''
import keras
import numpy as np
import kfast

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
dataset = kfast.data.ArrayDataset(rng.normal(size=(256, 8)).astype("float32"),
                                  rng.integers(0, 3, 256), batch_size=32)
my_pydataset = dataset
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
'''

CHECK = '''
assert len(model.history.history["loss"]) == 10, model.history.history
assert model.history.history["loss"][-1] < model.history.history["loss"][0]
print("TRAINED", loader.settings)
'''


def _run(tmp_path, code):
    script = tmp_path / "snippet.py"
    script.write_text(PRELUDE + code + CHECK)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KFAST_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_quick_start_diagnoses_tunes_with_the_model_and_trains(tmp_path):
    out = _run(tmp_path, readme_snippet("Quick start"))
    # diagnose printed its verdict, drew its picture, and tune picked settings by training steps/s.
    assert "TRAINED {'workers':" in out and (tmp_path / "diagnosis.png").stat().st_size > 0
    assert "input" in out.lower()


def test_feed_the_gpu_snippet_trains(tmp_path):
    out = _run(tmp_path, readme_snippet("Feed the GPU: `kfast.data.FastLoader`"))
    assert "TRAINED {'workers': 4, 'use_multiprocessing': True" in out
