"""What PyTorch's DataLoader and Keras's PyDataset promise, FastLoader keeps: every batch, the first too,
is loaded by a worker; errors keep their type; a dead worker is named; nothing leaks (issue 26)."""

import contextlib
import gc
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import datasets
from helpers import REPO, wait_for_file
from kfast.data import FastLoader
from kfast.data import WorkerError
from kfast.data._workers import sweep

MODES = [pytest.param(True, id="processes"), pytest.param(False, id="threads")]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
PRELUDE = f"import os, sys, time\nsys.path.insert(0, {os.path.join(REPO, 'tests')!r})\nimport datasets\n"


def _script(tmp_path, body, timeout=120):
    path = tmp_path / "script.py"
    path.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, env=ENV,
                          cwd=tmp_path)


# -- 1. the first batch is a worker's, as every other -----------------------------------------------------

@pytest.mark.parametrize("how, said", [("segfault", "was killed by signal 11"), ("exit", "exited with code 123")])
def test_a_first_batch_that_crashes_its_process_kills_a_worker_not_the_trainer(tmp_path, how, said):
    proc = _script(tmp_path, f"""
        from kfast.data import FastLoader, WorkerError
        try:
            next(iter(FastLoader(datasets.CrashesAt(at=0, how={how!r}, n=4), workers=1)))
        except WorkerError as e:
            print("WorkerError:", e)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FastLoader worker 0 (pid" in proc.stdout and f"{said} while loading batch index 0" in proc.stdout


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_slow_first_batch_is_under_timeout(use_multiprocessing):
    loader = FastLoader(datasets.SlowFirst(n=3, delay=20), workers=1, use_multiprocessing=use_multiprocessing,
                        timeout=1)
    start = time.monotonic()
    # Threads: the one still sleeping in __getitem__ is abandoned when the loader closes, and said so.
    abandoned = contextlib.nullcontext() if use_multiprocessing else pytest.warns(UserWarning, match="abandoned")
    with pytest.raises(WorkerError, match=r"timed out after 1 s .*batch index 0"), abandoned:
        next(iter(loader))
    assert time.monotonic() - start < 10
    loader.close()


def test_the_first_batch_comes_after_the_workers_own_set_up():
    with FastLoader(datasets.NeedsSetEpoch(n=4), workers=2) as loader:
        assert [int(x[0, 0]) for x, _ in loader] == [0, 1, 2, 3]


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_keras_look_ups_outside_an_epoch_are_loaded_by_a_worker(use_multiprocessing):
    # Keras reads loader[0] and loader[1] in the training process to learn the batch signature.
    with FastLoader(datasets.WhereLoaded(n=4), workers=1, use_multiprocessing=use_multiprocessing) as loader:
        x, y = loader[1]
        assert int(y[0, 0]) == 1
        assert (int(x[0, 0]) != os.getpid()) == use_multiprocessing
        assert [int(y[0, 0]) for _, y in loader] == [0, 1, 2, 3]  # the epoch is whole after the look-up


# -- 2. and 5. a worker that dies, or cannot start, is named ----------------------------------------------

def test_a_killed_worker_is_named_and_the_pool_closed():
    loader = FastLoader(datasets.Squares(n=50, delay=0.02), workers=2, max_queue_size=4)
    stream = iter(loader)
    next(stream)
    taken = 1
    while not all(loader._stream._pool._started) and taken < 20:  # both at work (not still starting)
        next(stream)
        taken += 1
    assert all(loader._stream._pool._started)
    victim = loader._stream._pool._processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=10)
    with pytest.raises(WorkerError, match=rf"FastLoader worker 1 \(pid {victim.pid}\) was killed by signal 9"):
        for _ in range(50 - taken):
            next(stream)
    assert loader._stream._pool is None  # closed: the other worker is gone too
    loader.close()


def test_a_worker_that_cannot_start_says_why_and_that_no_batch_was_loading():
    loader = FastLoader(datasets.BrokenInWorkers(n=4), workers=1)
    with pytest.raises(WorkerError) as caught:
        next(iter(loader))
    text = str(caught.value)
    assert "failed while starting, before loading any batch" in text and "while loading batch" not in text
    assert "FileNotFoundError: the source file of BrokenInWorkers is missing" in text
    assert "_refuse_to_unpickle" in text  # the worker's own traceback
    loader.close()


# -- 3. slots that grow while a worker is still starting ---------------------------------------------------

def test_slots_grow_while_a_slow_worker_starts(tmp_path):
    data = datasets.GrowsSlowStart(marker=str(tmp_path / "first"), n=12, delay=2.0)
    with FastLoader(data, workers=3, max_queue_size=6) as loader:
        got = [(int(y[0, 0]), len(y)) for _, y in loader]
    assert got == [(i, 64 * (i + 1)) for i in range(12)]


# -- 4. threads of a dropped loader end ---------------------------------------------------------------------

def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("kfast-loader-")]


def test_threads_of_a_loader_dropped_without_close_end():
    before = set(_loader_threads())
    loader = FastLoader(datasets.Squares(n=10), workers=4, use_multiprocessing=False)
    stream = iter(loader)
    next(stream), next(stream)
    assert len(set(_loader_threads()) - before) == 4
    del stream, loader
    gc.collect()
    deadline = time.monotonic() + 10
    while set(_loader_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(_loader_threads()) - before


# -- 6. errors keep their type ------------------------------------------------------------------------------

@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_dataset_error_keeps_its_type_and_gains_the_facts(use_multiprocessing):
    loader = FastLoader(datasets.Failing(n=8, bad=3), workers=2, use_multiprocessing=use_multiprocessing)
    with pytest.raises(ValueError, match="cannot decode record 3") as caught:
        list(loader)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "failed on batch index 3" in notes and "in __getitem__" in "".join(
        __import__("traceback").format_exception(caught.value))
    if use_multiprocessing:
        assert "FastLoader worker" in notes and "(pid " in notes and "the worker's traceback" in notes
    loader.close()


def test_an_error_that_cannot_travel_becomes_a_worker_error_with_its_traceback():
    with FastLoader(datasets.RaisesUnpicklable(n=4, bad=2), workers=1) as loader:
        with pytest.raises(WorkerError, match=r"(?s)failed on batch index 2.*RuntimeError: decoder state lost"):
            list(loader)


def test_inside_fit_the_type_decides_tensorflows_error_as_for_keras_own_pydataset():
    tf = pytest.importorskip("tensorflow")
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    for data in (datasets.Failing(n=6, bad=4), FastLoader(datasets.Failing(n=6, bad=4), workers=2)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="cannot decode record 4"):
            model.fit(data, epochs=1, verbose=0)
        if hasattr(data, "close"):
            data.close()


# -- 7. namedtuples --------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_namedtuple_batches_keep_their_type(use_multiprocessing):
    with FastLoader(datasets.NamedPairs(n=8), workers=1, max_queue_size=2,
                    use_multiprocessing=use_multiprocessing) as loader:
        batches = list(loader)
        if use_multiprocessing:
            assert loader._stream._pool.shm_batches >= 3  # through shared memory (4 slots, all held), where the type was lost
    assert all(type(b) is datasets.Pair for b in batches)
    assert [int(b.label[0, 0]) for b in batches] == list(range(8))


# -- seeds: the same augmentations whichever worker loads a batch ----------------------------------------

def _draws(loader, epochs=2):
    return [[tuple(x.tolist()) for x, _ in loader] for _ in range(epochs)]


def test_the_same_seed_draws_the_same_per_batch_whatever_the_workers_and_restarts():
    with FastLoader(datasets.Draws(n=8), workers=2, seed=3) as loader:
        two = _draws(loader)
    with FastLoader(datasets.Draws(n=8), workers=1, seed=3) as loader:
        one = _draws(loader)
    with FastLoader(datasets.Draws(n=8), workers=2, seed=3) as loader:
        stream = iter(loader)
        head = [tuple(next(stream)[0].tolist()) for _ in range(3)]
        loader.close()  # a restart mid-epoch: the new workers go on with batch 3 of the same iteration
        restarted = [head + [tuple(x.tolist()) for x, _ in stream]] + _draws(loader, 1)
    assert one == two == restarted
    assert len({d for epoch in two for d in epoch}) == 16  # no batch, and no epoch, repeats another's draws
    with FastLoader(datasets.Draws(n=8), workers=2, seed=4) as loader:
        assert _draws(loader) != two


def test_a_namedtuple_class_of_the_training_script_comes_back_as_itself(tmp_path):
    proc = _script(tmp_path, """
        import collections
        import json
        import numpy as np
        from kfast.data import FastLoader

        Batch = collections.namedtuple("Batch", ["x", "y"])

        class Data:
            def __len__(self):
                return 6

            def __getitem__(self, i):
                return Batch(np.full((2, 2), i, "float32"), np.full(2, i))

        if __name__ == "__main__":
            with FastLoader(Data(), workers=1, max_queue_size=2) as loader:
                batches = list(loader)
                print(json.dumps([loader._stream._pool.shm_batches, [type(b).__name__ for b in batches],
                                  [int(b.y[0]) for b in batches]]))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shm, names, ys = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shm >= 3 and names == ["Batch"] * 6 and ys == [0, 1, 2, 3, 4, 5]


# -- 8. SIGTERM while the training loop waits, and what a killed group left ---------------------------------

def _segments(pid):
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"kfast_{pid}_")}


@pytest.mark.timeout(180)
def test_sigterm_during_a_stuck_batch_in_fit_ends_the_process_and_leaves_nothing(tmp_path, short_tmp_path):
    marker, tmp = tmp_path / "stuck", short_tmp_path  # TMPDIR: the fork server's socket lives under it
    path = tmp_path / "train.py"
    path.write_text(PRELUDE + textwrap.dedent(f"""
        import keras
        from kfast.data import FastLoader
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        model.fit(FastLoader(datasets.Stuck(n=20, stuck=5, marker={str(marker)!r}), workers=2), epochs=3, verbose=0)
    """))
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "TMPDIR": str(tmp)})
    try:
        wait_for_file(proc, marker, 90)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert _segments(proc.pid) and glob.glob(str(tmp / "pymp-*"))
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10, err
        assert proc.returncode == 128 + signal.SIGTERM and "SIGTERM" in err, err[-2000:]
        _, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, alive
        assert not _segments(proc.pid) and not glob.glob(str(tmp / "pymp-*"))
    finally:
        proc.kill()
        proc.communicate()


def test_the_next_loader_sweeps_what_a_killed_process_group_left(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shm = tmp_path / "shm"
    shm.mkdir()
    left = [shm / f"kfast_{dead.pid}_0123456789ab", tmp_path / "pymp-left"]
    kept = [shm / f"kfast_{os.getpid()}_ba9876543210", tmp_path / "pymp-alive", tmp_path / "pymp-other"]
    left[0].write_bytes(b"x")
    kept[0].write_bytes(b"x")
    for folder, pid in ((left[1], dead.pid), (kept[1], os.getpid())):
        folder.mkdir()
        (folder / sweep.OWNER_FILE).write_text(str(pid))
    kept[2].mkdir()  # not a loader's: no owner file
    monkeypatch.setattr(sweep, "_done", False)
    removed = sweep.sweep(shm_dir=str(shm), temp_root=str(tmp_path))
    assert sorted(removed) == sorted(str(p) for p in left)
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    assert sweep.sweep(shm_dir=str(shm), temp_root=str(tmp_path)) == []  # once per process
