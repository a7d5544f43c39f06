"""README's first quick start and the FastLoader guide's first block (docs/loader.md), taken from the pages
themselves, run as users would paste them after defining their model and data (DOCS_PRELUDE)."""

import subprocess
import sys

from helpers import DOCS_PRELUDE, REPO, doc_snippet

CHECK = '''
assert len(model.history.history["loss"]) == 10, model.history.history
assert model.history.history["loss"][-1] < model.history.history["loss"][0]
print("TRAINED", dict(loader.settings))  # a mapping of the three settings
'''


def _run(tmp_path, code):
    script = tmp_path / "snippet.py"
    script.write_text(DOCS_PRELUDE + code + CHECK)
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
