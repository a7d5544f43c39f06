"""FastLoader where users are: datasets from anywhere, stuck batches, signals, small /dev/shm, epochs."""

import glob
from contextlib import nullcontext
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import psutil
import pytest

import datasets
import kfast
from helpers import REPO
from kfast.data import FastLoader
from kfast.data import WorkerError
from kfast.data._workers import pool

MODES = [pytest.param(True, id="processes"), pytest.param(False, id="threads")]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
PRELUDE = f"import os, sys, time\nsys.path.insert(0, {os.path.join(REPO, 'tests')!r})\nimport datasets\n"


def _ids(batches):
    return [int(np.asarray(x)[0, 0]) for x, *_ in batches]


def _shm_segments(pid):
    """The loader segments process `pid` created (they are named after it): other jobs do not count."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"kfast_{pid}_")}


def _pymp_dirs(script):
    """multiprocessing's temporary directories of the script started by `_start_script(script, ...)`."""
    return set(glob.glob(os.path.join(_tmpdir(script), "pymp-*")))


def _tmpdir(script):
    return os.path.join(os.path.dirname(script), "tmp")


def _wait_for(path, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


# -- any dataset, any place --------------------------------------------------------------------------

def test_dataset_defined_on_stdin_works_in_worker_processes(tmp_path):
    code = textwrap.dedent("""
        import numpy as np
        from kfast.data import FastLoader

        class Doubles:  # lives in __main__, read from stdin: no module can import it by name
            def __len__(self):
                return 5

            def __getitem__(self, i):
                return np.full((2, 2), 2 * i, "int64")

        with FastLoader(Doubles(), workers=2, use_multiprocessing=True) as loader:
            print([int(b[0, 0]) for b in loader], loader._stream._pool.shm_batches + loader._stream._pool.pickled_batches)
    """)
    proc = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 2, 4, 6, 8] 5"


# -- never hang silently -----------------------------------------------------------------------------

@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_timeout_names_the_batch_the_worker_and_where_it_is_stuck(use_multiprocessing):
    loader = FastLoader(datasets.Stuck(n=6, stuck=2), workers=2, use_multiprocessing=use_multiprocessing,
                        timeout=1.5)
    start = time.monotonic()
    abandoned = pytest.warns(UserWarning, match="abandoned") if not use_multiprocessing else nullcontext()
    with pytest.raises(WorkerError) as caught, abandoned:  # threads: the stuck one is left behind, said so
        list(loader)
    assert time.monotonic() - start < 30
    message = str(caught.value)
    assert "timed out after 1.5 s (timeout=)" in message and "batch index 2" in message
    assert "in __getitem__" in message and "datasets.py" in message  # the worker's own stack
    if use_multiprocessing:
        assert "pid" in message
    loader.close()


def test_a_stalled_batch_warns_with_the_same_facts(monkeypatch):
    monkeypatch.setattr(pool, "_STALL_WARNING_S", 0.5)
    with FastLoader(datasets.Squares(n=3, delay=1.2), workers=1) as loader:
        with pytest.warns(UserWarning, match=r"(?s)has waited 1 s for batch index \d from worker 0 \(pid \d+\); its stack:.*in __getitem__"):
            assert _ids(loader) == [0, 1, 2]


def _start_script(path, body):
    """Writes PRELUDE + `body` to `path` and starts it, its output piped."""
    path.write_text(PRELUDE + textwrap.dedent(body))
    # A temporary directory of its own, so a leak check sees this script's directories only.
    os.makedirs(_tmpdir(path), exist_ok=True)
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**ENV, "TMPDIR": _tmpdir(path)})


def _children(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(180)
def test_ctrl_c_with_a_stuck_worker_inside_fit_exits_fast_and_leaves_nothing(short_tmp_path):
    marker, script = short_tmp_path / "stuck", short_tmp_path / "train.py"
    proc = _start_script(script, f"""
        import keras
        from kfast.data import FastLoader
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        model.fit(FastLoader(datasets.Stuck(n=20, stuck=5, marker={str(marker)!r}), workers=2), epochs=3, verbose=0)
    """)
    try:
        _wait_for(marker, proc)
        descendants = _children(proc.pid)
        assert len(descendants) >= 3  # fork server, resource tracker, workers
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 5, err
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        _, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, alive
        assert not _shm_segments(proc.pid) and not _pymp_dirs(script)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.timeout(180)
def test_killed_trainer_leaves_no_workers_segments_or_temp_dirs(short_tmp_path):
    marker, script = short_tmp_path / "stuck", short_tmp_path / "load.py"
    proc = _start_script(script, f"""
        from kfast.data import FastLoader
        print(list(FastLoader(datasets.Stuck(n=8, stuck=4, marker={str(marker)!r}), workers=2)))
    """)
    try:
        _wait_for(marker, proc)
        descendants = _children(proc.pid)
        assert _pymp_dirs(script) and _shm_segments(proc.pid)  # there is something to clean up
        proc.kill()
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(descendants, timeout=15)
        assert not alive, alive
        deadline = time.monotonic() + 10
        while (_shm_segments(proc.pid) or _pymp_dirs(script)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _shm_segments(proc.pid) and not _pymp_dirs(script)
    finally:
        proc.kill()
        proc.communicate()


def test_threads_close_returns_with_a_stuck_thread_and_exit_is_not_blocked(short_tmp_path):
    script = short_tmp_path / "threads.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        import warnings
        from kfast.data import FastLoader, WorkerError
        loader = FastLoader(datasets.Stuck(n=6, stuck=1), workers=2, use_multiprocessing=False, timeout=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                list(loader)  # the timeout closes the loader, which cannot stop the stuck thread
            except WorkerError as e:
                print("error:", str(e).splitlines()[0])
            print("warned:", caught[0].message)
        loader.close()
        print("exiting")
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "error: FastLoader timed out after 1 s" in proc.stdout
    assert "warned: FastLoader left 1 worker thread(s) still inside" in proc.stdout
    assert proc.stdout.rstrip().endswith("exiting")  # and the interpreter exited with the thread stuck


# -- shared memory that fits --------------------------------------------------------------------------

def test_numeric_batches_travel_through_shared_memory():
    # The first batches asked for travel pickled: the slots are made for the first that comes back.
    with FastLoader(datasets.Squares(n=6), workers=2, max_queue_size=2) as loader:
        assert _ids(loader) == list(range(6)) and _ids(loader) == list(range(6))
        assert loader._stream._pool.pickled_batches <= 2 and loader._stream._pool.shm_batches == 12 - loader._stream._pool.pickled_batches


def test_slots_grow_when_a_larger_batch_than_the_first_comes():
    # Short first batch (as when shuffling draws the short last batch first): only the first larger
    # batch travels pickled, then the slots fit.
    with FastLoader(datasets.Sized([2] + [64] * 9), workers=2, max_queue_size=2) as loader:
        assert _ids(loader) == list(range(10))
        assert _ids(loader) == list(range(10))
        assert loader._stream._pool.pickled_batches <= 3 and loader._stream._pool.shm_batches >= 17


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_a_1_mib_dev_shm_works_with_a_warning(tmp_path):
    script = tmp_path / "small_shm.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        from kfast.data import FastLoader
        for mib in (0.25, 0.6):
            with FastLoader(datasets.Big(n=6, mib=mib), workers=2, max_queue_size=4) as loader:
                ids = [int(x[0, 0]) for x, y in loader]
                print(mib, ids, loader._stream._pool.shm_batches, loader._stream._pool.pickled_batches)
    """))
    command = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} {script}"
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ring_3_slots, pickled = lines[0].split(), lines[1].split()
    assert ring_3_slots[1:7] == ["[0,", "1,", "2,", "3,", "4,", "5]"] and int(ring_3_slots[7]) > 0
    assert pickled[1:7] == ["[0,", "1,", "2,", "3,", "4,", "5]"] and pickled[7:] == ["0", "6"]
    assert "/dev/shm has" in proc.stderr and "--shm-size" in proc.stderr
    assert "Bus error" not in proc.stderr


# -- epochs Keras can trust ---------------------------------------------------------------------------

def _predicted_ids(model, loader):
    return sorted(int(v) for v in np.asarray(model.predict(loader, verbose=0))[::4, 0])


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_keras_epoch_starts_at_a_boundary_after_a_partial_iteration(shuffle):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t[:, :1])])
    with FastLoader(datasets.Squares(n=8), workers=2, shuffle=shuffle, seed=3) as loader:
        stream = iter(loader)
        for _ in range(3):  # what kfast.diagnose does: consume a few batches
            next(stream)
        assert _predicted_ids(model, loader) == list(range(8))
        assert _predicted_ids(model, loader) == list(range(8))


def test_diagnose_then_fit_sees_every_batch_once():
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    with FastLoader(datasets.Squares(n=70), workers=2, shuffle=True, seed=1) as loader:
        kfast.diagnose(model, loader, steps=4, warmup=1)
        assert 0 < loader.state_dict()["batches_done"] < len(loader)  # diagnose left its iteration inside an epoch
        predicted = _predicted_ids(keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t[:, :1])]),
                                   loader)
        model.fit(loader, epochs=1, verbose=0, callbacks=[Record()])
    assert predicted == list(range(70)) and seen == list(range(70))


# -- seeds, bounds, Keras's PyDataset conventions ----------------------------------------------------

def test_workers_draw_different_random_numbers_every_epoch():
    with FastLoader(datasets.Draws(n=8), workers=2, seed=7) as loader:
        epochs = [[tuple(x.tolist()) for x, _ in loader] for _ in range(2)]
    draws = [d for epoch in epochs for d in epoch]
    assert len(set(draws)) == len(draws)  # no worker, and no epoch, repeats another's numbers


def test_batch_seed_follows_seed_epoch_and_index():
    from kfast.data._workers.worker import seed_batch

    seed_batch(7, 1, 2)
    first = (np.random.randint(2**31), __import__("random").random())
    seed_batch(7, 1, 2)
    assert (np.random.randint(2**31), __import__("random").random()) == first
    seed_batch(7, 0, 2)
    assert np.random.randint(2**31) != first[0]


def test_too_many_workers_are_capped_with_a_warning():
    with pytest.warns(UserWarning, match=r"workers=100000, more than 4 per usable CPU core .*using \d+"):
        loader = FastLoader(datasets.Squares(), workers=100000)
    assert loader.settings["workers"] == 4 * len(os.sched_getaffinity(0))


@pytest.mark.parametrize("kwargs, match", [
    ({"seed": -1}, r"seed=-1; it must be an int >= 0"),
    ({"seed": "abc"}, r"seed='abc'; it must be an int >= 0"),
    ({"timeout": 0}, r"timeout=0; it must be a finite number of seconds > 0"),
    ({"timeout": float("nan")}, r"timeout=nan"),
])
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FastLoader(datasets.Squares(), **kwargs)


def test_a_queue_that_cannot_fit_in_memory_is_refused():
    loader = FastLoader(datasets.Big(n=2, mib=8), workers=1, max_queue_size=10**6)
    with pytest.raises(ValueError, match=r"max_queue_size=1000000: .* more than half the .* Lower max_queue_size"):
        next(iter(loader))


def test_a_deep_queue_starts_without_delay():
    with FastLoader(datasets.Squares(n=30), workers=2, max_queue_size=10000) as loader:
        assert _ids(loader) == list(range(30))


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_dict_batches_may_order_their_keys_differently(use_multiprocessing):
    with FastLoader(datasets.ReorderedKeys(n=4), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        batches = list(loader)
    assert [int(x["a"][0, 0]) for x, _ in batches] == [0, 1, 2, 3]
    assert all(np.array_equal(x["b"], x["a"] + 1) for x, _ in batches)


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_keras_pydataset_conventions_in_fit(use_multiprocessing):
    # num_batches instead of __len__, (x, y, sample_weight) batches, epoch hooks in order.
    data = datasets.CountedBatches(n=4)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with FastLoader(data, workers=2, use_multiprocessing=use_multiprocessing) as loader:
        history = model.fit(loader, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    # Keras on JAX and PyTorch first reads one batch to build the model: an epoch of its own for the hooks, as
    # for any PyDataset (Keras calls on_epoch_begin and on_epoch_end around it).
    epochs = 2 if keras.backend.backend() == "tensorflow" else 3
    assert data.hooks == ["begin", "end"] * epochs


def test_a_worker_error_inside_fit_reaches_the_training_process():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    with FastLoader(datasets.Failing(bad=2), workers=2) as loader:
        with pytest.raises(Exception, match=r"cannot decode record 2"):
            model.fit(loader, epochs=1, verbose=0)


def test_a_forked_child_stopped_by_sigterm_leaves_the_parents_loaders_alone(tmp_path):
    # Keras's own process pool forks the training process and stops its children with SIGTERM: a child
    # must not close the parent's loaders or remove the fork server's directory (the next pool then failed),
    # nor, through the signal wake-up socket it shares with the parent, end a parent that waits for a batch.
    script = tmp_path / "fork.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        import multiprocessing, signal
        from kfast.data import FastLoader
        with FastLoader(datasets.Squares(n=4, delay=0.6), workers=1) as loader:
            print([int(x[0, 0]) for x, _ in loader])
            pid = os.fork()
            if pid == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            print("child:", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM,
                  "dir:", os.path.isdir(multiprocessing.util.get_temp_dir()))
            print([int(x[0, 0]) for x, _ in loader])
        with FastLoader(datasets.Squares(n=3), workers=1) as again:
            print([int(x[0, 0]) for x, _ in again])
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["[0, 1, 2, 3]", "child: True dir: True", "[0, 1, 2, 3]", "[0, 1, 2]"]



@pytest.mark.timeout(180)
def test_sighup_frees_the_loaders_and_ends_the_process_by_it_unless_the_user_handles_it(short_tmp_path):
    marker, script = short_tmp_path / "stuck", short_tmp_path / "hup.py"
    proc = _start_script(script, f"""
        import signal
        from kfast.data import FastLoader
        def mine(signum, frame):
            print("user's", signal.Signals(signum).name, flush=True)
        signal.signal(signal.SIGTERM, mine)  # the user's own: kfast leaves it in charge
        with FastLoader(datasets.Squares(n=3), workers=1) as loader:
            print([int(x[0, 0]) for x, _ in loader], flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        print(list(FastLoader(datasets.Stuck(n=8, stuck=4, marker={str(marker)!r}), workers=2)))
    """)
    try:
        _wait_for(marker, proc)
        assert _pymp_dirs(script) and _shm_segments(proc.pid)  # there is something to clean up
        descendants = _children(proc.pid)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGHUP, err  # died of the signal, as without kfast
        assert out.splitlines() == ["[0, 1, 2]", "user's SIGTERM"], out
        _, alive = psutil.wait_procs(descendants, timeout=10)
        assert not alive, alive
        assert not _shm_segments(proc.pid) and not _pymp_dirs(script)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.timeout(120)
def test_a_tmpdir_too_long_for_the_fork_servers_socket_is_named_with_the_fix(short_tmp_path):
    # multiprocessing's own error was "OSError: AF_UNIX path too long", from deep inside its fork server.
    long_dir = short_tmp_path / ("d" * (90 - len(str(short_tmp_path)) - 1))
    long_dir.mkdir()
    script = short_tmp_path / "load.py"
    script.write_text(PRELUDE + "from kfast.data import FastLoader\n"
                                "print(_ := list(FastLoader(datasets.Squares(n=2), workers=1)))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                          env={**ENV, "TMPDIR": str(long_dir)})
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"OSError: FastLoader(use_multiprocessing=True) starts its workers from multiprocessing's "
                           f"fork server, which listens on a Unix socket in {long_dir}/pymp-"), last
    assert last.endswith(f"that socket's path would be 122 characters, and Linux allows 107. The directory comes "
                         f"from TMPDIR ({long_dir}, 90 characters): set TMPDIR to a directory of at most 75 characters "
                         "(TMPDIR=/tmp), or pass use_multiprocessing=False to use threads."), last
    # With TMPDIR of exactly that length, it works.
    fits = short_tmp_path / ("f" * (75 - len(str(short_tmp_path)) - 1))
    fits.mkdir()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                          env={**ENV, "TMPDIR": str(fits)})
    assert len(str(fits)) == 75 and proc.returncode == 0, proc.stderr[-2000:]
