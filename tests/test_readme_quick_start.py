"""README's first quick start and the FastLoader guide's first block (docs/loader.md), taken from the pages
themselves, run as users would paste them after defining their model and data (DOCS_PRELUDE)."""

import subprocess
import sys

from helpers import DOCS_PRELUDE, REPO, code_blocks, doc_snippet

CHECK = '''
assert len(model.history.history["loss"]) == 10, model.history.history
assert model.history.history["loss"][-1] < model.history.history["loss"][0]
print("TRAINED", dict(loader.settings))  # a mapping of the three settings
'''


def _run(tmp_path, code, prelude=DOCS_PRELUDE, check=CHECK):
    script = tmp_path / "snippet.py"
    script.write_text(prelude + code + check)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KFAST_CACHE_DIR": str(tmp_path / "cache"),
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_quick_start_diagnoses_tunes_with_the_model_and_trains(tmp_path):
    code = doc_snippet("Quick start")
    assert "kfast.tune(dataset, model=model)" in code  # README's, not another page's
    out = _run(tmp_path, code)
    # diagnose printed its verdict, drew its picture, and tune picked settings by training steps/s.
    assert "TRAINED {'workers':" in out and (tmp_path / "diagnosis.png").stat().st_size > 0
    assert "input" in out.lower()


def test_feed_the_gpu_snippet_trains(tmp_path):
    out = _run(tmp_path, doc_snippet("Feed the GPU: `kfast.data.FastLoader`"))
    assert "TRAINED {'workers': 4, 'use_multiprocessing': True" in out


TF_DATA_PRELUDE = '''
import os
import keras
import numpy as np
import kfast, kfast.callbacks

rng = np.random.default_rng(0)
for label, level in (("cats", 60), ("dogs", 190)):  # the user's folder of class folders: 2 x 24 JPEGs
    os.makedirs(f"images/{label}")
    for i in range(24):
        keras.utils.save_img(f"images/{label}/{i}.jpg", np.clip(rng.normal(level, 30, (64, 64, 3)), 0, 255))
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Conv2D(4, 3),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
'''

TF_DATA_CHECK = '''
import tensorflow as tf
assert isinstance(train_ds, tf.data.Dataset), type(train_ds)
history = model.history.history
assert len(history["loss"]) == 10 and history["loss"][-1] < history["loss"][0], history
assert history["steps_per_second"][-1] > 0, history
print("TRAINED ON", type(train_ds).__name__)
'''


def test_quick_start_tf_data_path_diagnoses_tunes_the_pipeline_and_trains(tmp_path):
    with open(f"{REPO}/README.md") as f:
        blocks = [b["code"] for b in code_blocks(f.read()) if b["lang"] == "python" and "Quick start" in b["headings"]]
    code = next(b for b in blocks if "image_dataset_from_directory" in b)
    out = _run(tmp_path, code, TF_DATA_PRELUDE, TF_DATA_CHECK)
    assert "TRAINED ON" in out and "input" in out.lower()
