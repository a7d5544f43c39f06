"""`make demo`'s first part (scripts/demo_starved.py) runs and shows the before and after side by side."""

import os
import re
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
    for row in ("verdict", "compute, % of step", "input wait, % of step", "other, % of step", "training steps/s",
                "model alone, steps/s"):
        assert row in table, table
    assert (tmp_path / "before.png").stat().st_size > 0 and (tmp_path / "after.png").stat().st_size > 0
    # One accounting (issue 36): each diagnosis's shares of a step, as its text prints them, are the table's
    # within 2 points, and add up to 100%.
    before_text, after_text = out.split("== 2.")[0], out.split("== 3.")[1].split("== Before and after")[0]
    for column, text in ((0, before_text), (1, after_text)):
        printed = _shares_of_the_text(text)
        assert sum(printed.values()) == 100, text
        for part, share in printed.items():
            in_table = int(re.search(rf"^  {part}, % of step +(\d+)% +(\d+)%$", table, re.M).group(column + 1))
            assert abs(in_table - share) <= 2, (part, column, text, table)
        not_computing = int(re.search(r"\((?:could be [^;]+; )?(\d+)% of each step not spent computing", text).group(1))
        assert abs(not_computing - (100 - printed["compute"])) <= 2, text
    # Advice is an action, never the value already set.
    assert not re.search(r"from (\d+) to \1\b", out), out


def _shares_of_the_text(text):
    m = re.search(r"a typical step \([\d.]+ ms\): (\d+)% compute, (\d+)% input wait, (\d+)% other \(hand-off", text)
    assert m, text
    return dict(zip(("compute", "input wait", "other"), map(int, m.groups())))
