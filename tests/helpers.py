"""Test helpers shared by every test module (on sys.path through pytest's `pythonpath`)."""

import os
import shutil
import subprocess
import sys

import keras
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _horovodrun():
    return shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")


@pytest.fixture
def horovodrun():
    """Runs `horovodrun -np N -H localhost:N --gloo python SCRIPT ARGS...` and returns its output.

    Fails the test on a non-zero exit (or expect_fail=True on a zero exit) or on the timeout, showing
    what every rank printed.
    """

    def run(script, *args, np=2, timeout=240, expect_fail=False, env=None, cwd=REPO):
        cmd = [_horovodrun(), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
               sys.executable, os.path.join(REPO, script), *map(str, args)]
        full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                                  cwd=cwd, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{e.stdout}\n{e.stderr}")
        output = proc.stdout + proc.stderr
        if (proc.returncode != 0) != expect_fail:
            pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{output}")
        return output

    return run


def rank_lines(output, marker):
    """Returns {rank: line} for lines of the form '[r]<stdout>:... marker ...'."""
    found = {}
    for line in output.splitlines():
        if line.startswith("[") and "]<stdout>:" in line and marker in line:
            found[int(line[1:line.index("]")])] = line.split("]<stdout>:", 1)[1]
    return found


class RecordRates(keras.callbacks.Callback):
    """Records the learning rate each batch trains with (place it after the callbacks that set the rate)."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
