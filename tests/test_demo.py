"""`make demo`'s first part (scripts/demo_starved.py) runs and shows the before and after side by side."""

import os
import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.slow
def test_the_starved_model_demo_diagnoses_tunes_and_compares(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "demo_starved.py"), str(tmp_path),
                           "--batches", "24", "--budget", "6"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # The PyDataset as Keras runs it loads in the training loop: the first diagnosis finds it starved.
    assert "kfast diagnosis: INPUT-BOUND" in out.split("== 2.")[0], out
    assert "chosen: LoaderSettings(" in out and "== Before and after" in out
    table = out.split("== Before and after")[1]
    for row in ("verdict", "waiting for input", "training steps/s", "model alone, steps/s"):
        assert row in table, table
    assert (tmp_path / "before.png").stat().st_size > 0 and (tmp_path / "after.png").stat().st_size > 0
