"""Test helpers shared by every test module (on sys.path through pytest's `pythonpath`)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile

import keras
import psutil
import pytest

from kfast.distributed import horovodrun_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _horovodrun():
    return horovodrun_path()


def interrupt_and_wait(proc, timeout=60):
    """Sends `proc` Ctrl-C (SIGINT) and returns its (stdout, stderr) once it ends; fails the test, with what
    it printed, when it has not ended within `timeout` seconds (it is killed then)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the interrupted process did not exit within {timeout} s\n{out}\n{err}")


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


def run_horovodrun(script, *args, np=2, timeout=240, expect_fail=False, env=None, cwd=REPO):
    """What the `horovodrun` fixture runs, as a plain function: one job, its output returned."""
    cmd = [_horovodrun(), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
           sys.executable, os.path.join(REPO, script), *map(str, args)]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    return job_output(cmd, lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                                  env=full_env, cwd=cwd, start_new_session=True),
                      timeout=timeout, expect_fail=expect_fail)


@pytest.fixture(scope="module")
def horovodrun_module():
    """The `horovodrun` fixture for a module-scoped fixture: one job that several tests share, each asserting
    its own part of what the job wrote (tests/distributed/test_tf_data.py). A test that uses it is marked
    `distributed` like one that uses `horovodrun` (tests/conftest.py)."""
    return run_horovodrun


def wait_for_file(proc, path, timeout):
    """Waits until `path` exists while `proc` runs; fails with the process's output if it ends first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def rank_lines(output, marker):
    """Returns {rank: line} for lines of the form '[r]<stdout>:... marker ...'."""
    found = {}
    for line in output.splitlines():
        if line.startswith("[") and "]<stdout>:" in line and marker in line:
            found[int(line[1:line.index("]")])] = line.split("]<stdout>:", 1)[1]
    return found


def assert_stopped_resumably(output, ranks):
    """Asserts that horovodrun's `output` shows its `ranks` ranks stopped with status 75 (a preemption's stop).

    horovodrun names the first rank to end, with its status, then stops the others through the shells it
    started them in: a rank that itself ended with 75 a moment later can be listed with its shell's 143.
    """
    first = re.search(r"The first process to do so was:\s*Process name: (\d+)\s*Exit code: (-?\d+)", output)
    assert first and first.group(2) == "75", output[-4000:]
    for rank in range(ranks):
        listed = re.findall(rf"Process {rank} exit with status code (-?\d+)\.", output)
        allowed = [["75"]] if rank == int(first.group(1)) else [["75"], ["143"]]
        assert listed in allowed, (rank, listed, output[-4000:])


def rewrite_state(path, state):
    """Replaces kfast's training state (kfast-state.json) inside the checkpoint at `path` by `state`."""
    with zipfile.ZipFile(path) as z:
        entries = {info.filename: z.read(info) for info in z.infolist()}
    entries["kfast-state.json"] = json.dumps(state).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


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


# What a user has before a documentation snippet (README's quick start, a guide's block): a compiled model and a
# dataset (a keras.utils.PyDataset), seeded, small enough to train in seconds.
DOCS_PRELUDE = '''
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

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
_ATTR = re.compile(r'(\w[\w-]*)="([^"]*)"')


def markdown_pages():
    """README.md and every page of the docs site (docs/**/*.md), as paths relative to the repository."""
    pages = ["README.md"]
    for root, _, files in os.walk(os.path.join(REPO, "docs")):
        pages += [os.path.relpath(os.path.join(root, f), REPO) for f in files if f.endswith(".md")]
    return sorted(pages)


def code_blocks(text):
    """The fenced code blocks of a Markdown text, outermost fences only (a block shown inside a longer
    fence is that fence's content, not a block).

    Returns:
        Dicts with `line` (of the opening fence, from 1), `lang`, `attrs` (the `key="value"` pairs after the
        language, such as `test="skip: ..."`), `code`, and `headings`: the section titles above the block,
        outermost first.
    """
    blocks, headings, current = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if current is not None:
            if fence and len(fence["fence"]) >= len(current["fence"]) and not fence["info"].strip():
                blocks.append({key: current[key] for key in ("line", "lang", "attrs", "headings")}
                              | {"code": "".join(current["lines"])})
                current = None
            else:
                current["lines"].append(line[len(current["indent"]):] + "\n")
        elif fence:
            info = fence["info"].strip()
            current = {"line": number, "fence": fence["fence"], "indent": fence["indent"], "lines": [],
                       "lang": info.split()[0] if info else "", "attrs": dict(_ATTR.findall(info)),
                       "headings": [title for _, title in headings]}
        elif heading := _HEADING.match(line):
            level = len(heading[1])
            headings = [(lvl, title) for lvl, title in headings if lvl < level] + [(level, heading[2])]
    return blocks


def doc_snippet(heading):
    """The first python block of the section titled `heading` (at any level), in README.md or a docs page,
    exactly as users read it. Exactly one page may have a python block under that title."""
    found = []
    for page in markdown_pages():
        with open(os.path.join(REPO, page)) as f:
            blocks = [b for b in code_blocks(f.read()) if b["lang"] == "python" and heading in b["headings"]]
        if blocks:
            found.append((page, blocks[0]["code"]))
    assert len(found) == 1, f"python blocks under the heading {heading!r}: {[page for page, _ in found]}"
    return found[0][1]


readme_snippet = doc_snippet  # the name the tests written before docs/ existed use


def readme_scale_out_snippet():
    """The first python block of the "Scale out" guide (docs/scale-out.md)."""
    return doc_snippet("Scale out: Horovod on Keras 3")


def loader_workers(process=None):
    """Loader worker processes: descendants, less multiprocessing's resource tracker and fork server."""
    found = []
    for child in (process or psutil.Process()).children():
        try:
            cmdline = " ".join(child.cmdline())
            if "forkserver" in cmdline:
                found += child.children()  # workers are forked by the server, and share its command line
            elif "resource_tracker" not in cmdline:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def batch_in_fresh_python(form, index, folder):
    """Batch `index` of `form` (a dataset's worker form), pickled, loaded in a fresh Python in `folder`, and which
    of keras and tensorflow that Python imported: `(batch, {"keras": bool, "tensorflow": bool})`."""
    import pickle

    (folder / "form.pkl").write_bytes(pickle.dumps(form))
    child = (f"import pickle, sys; batch = pickle.load(open('form.pkl', 'rb'))[{index}]; "
             "pickle.dump((batch, {m: m in sys.modules for m in ('keras', 'tensorflow')}), open('out.pkl', 'wb'))")
    proc = subprocess.run([sys.executable, "-c", child], cwd=folder, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return pickle.loads((folder / "out.pkl").read_bytes())

