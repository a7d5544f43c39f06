"""Test helpers shared by every test module (on sys.path through pytest's `pythonpath`)."""

import os
import re
import subprocess
import sys

import keras
import pytest

from kfast.distributed import horovodrun_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _horovodrun():
    return horovodrun_path()


def job_output(cmd, start, *, timeout, expect_fail=False):
    """Runs a job through `start()` (a `subprocess.run` of `cmd` with captured text output) and returns
    stdout + stderr; fails the test on the timeout, or on a non-zero exit (a zero one with expect_fail)."""
    try:
        proc = start()
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s\n{e.stdout}\n{e.stderr}")
    output = proc.stdout + proc.stderr
    if (proc.returncode != 0) != expect_fail:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n{output}")
    return output


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
        return job_output(cmd, lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                                      env=full_env, cwd=cwd, start_new_session=True),
                          timeout=timeout, expect_fail=expect_fail)

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


# The user's dataset for README's scale-out snippet (`from my_project import build_model, MyDataset`); tests
# put it beside their own build_model.
README_DATASET = '''

class MyDataset(keras.utils.PyDataset):
    def __init__(self, split, **kwargs):
        super().__init__(**kwargs)
        rng = np.random.default_rng(0 if split == "train" else 1)
        self.x = rng.normal(size=(8, 8, 10, 10, 1)).astype("float32")
        self.y = rng.integers(0, 3, size=(8, 8))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
'''


def readme_snippet(heading):
    """The first python block of README.md's section `heading`, exactly as users read it."""
    with open(os.path.join(REPO, "README.md")) as f:
        section = f.read().split(f"\n## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def readme_scale_out_snippet():
    """The first python block of README.md's "Scale out" section."""
    return readme_snippet("Scale out: Horovod on Keras 3")
