import os
import subprocess
import sys
import time
import traceback

import keras
import numpy as np
import psutil
import pytest

import datasets
from helpers import REPO
from helpers import loader_workers as _workers
from helpers import interrupt_and_wait
from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import WorkerError

MODES = [pytest.param(True, id="processes"), pytest.param(False, id="threads")]


def _ids(batches):
    return [int(x[0, 0]) for x, _ in batches]


def _tree(process):
    """`process`'s descendants with their command lines, for a failure message."""
    lines = []
    for child in process.children(recursive=True):
        try:
            lines.append(f"{child.pid} (parent {child.ppid()}, {child.status()}): {' '.join(child.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return "descendants:\n" + "\n".join(lines)


def _shm_segments(pid=None):
    """The loader segments of process `pid` (this one by default), named after it, so other jobs on the
    machine do not count."""
    pid = os.getpid() if pid is None else pid
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"kfast_{pid}_")}


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_batches_arrive_in_order_every_epoch(use_multiprocessing):
    data = datasets.Squares(n=11)
    with FastLoader(data, workers=2, use_multiprocessing=use_multiprocessing, max_queue_size=3) as loader:
        for _ in range(3):
            batches = list(loader)
            assert _ids(batches) == list(range(11))
            for i, (x, y) in enumerate(batches):
                np.testing.assert_array_equal(x, data[i][0])
                np.testing.assert_array_equal(y, data[i][1])
                assert x.dtype == np.float32 and y.dtype == np.int64


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_shuffle_is_a_seeded_permutation_per_epoch(use_multiprocessing):
    def orders(seed):
        with FastLoader(datasets.Squares(n=12), workers=2, use_multiprocessing=use_multiprocessing,
                        shuffle=True, seed=seed) as loader:
            return [_ids(loader) for _ in range(2)]

    first, second = orders(7)
    assert sorted(first) == sorted(second) == list(range(12))
    assert first != second and first != list(range(12))
    assert orders(7) == [first, second]


def test_non_numeric_batches_fall_back_to_pickling():
    with FastLoader(datasets.Plain(), workers=2) as loader:
        batches = list(loader)
    assert [b["name"] for b in batches] == [f"batch-{i}" for i in range(5)]
    np.testing.assert_array_equal(batches[4]["x"], np.arange(6).reshape(2, 3) + 4)


def test_batches_larger_than_a_slot_still_arrive_intact():
    with FastLoader(datasets.Growing(n=6), workers=2) as loader:
        batches = list(loader)
    assert [x.shape for x, _ in batches] == [(4 + i, 3) for i in range(6)]
    assert _ids(batches) == list(range(6))


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_dataset_on_epoch_end_is_honoured(use_multiprocessing):
    with FastLoader(datasets.EpochCounter(n=5), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        assert _ids(loader) == [0, 1, 2, 3, 4]
        assert _ids(loader) == [100, 101, 102, 103, 104]
        assert _ids(loader) == [200, 201, 202, 203, 204]


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_array_dataset_shuffles_samples_per_epoch_through_workers(use_multiprocessing):
    x = np.arange(50, dtype="float32").reshape(50, 1)
    data = ArrayDataset(x, x[:, 0] * 2, batch_size=8, shuffle=True, seed=3)
    with FastLoader(data, workers=2, use_multiprocessing=use_multiprocessing) as loader:
        epochs = []
        for _ in range(2):
            batches = list(loader)
            xs = np.concatenate([b[0][:, 0] for b in batches])
            ys = np.concatenate([b[1] for b in batches])
            np.testing.assert_array_equal(ys, xs * 2)
            assert sorted(xs.tolist()) == list(range(50))
            epochs.append(xs.tolist())
    assert epochs[0] != epochs[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_worker_exception_names_the_batch_and_carries_its_traceback(use_multiprocessing):
    loader = FastLoader(datasets.Failing(n=8, bad=3), workers=2, use_multiprocessing=use_multiprocessing)
    with pytest.raises(ValueError, match="cannot decode record 3") as info:  # the dataset's own type
        list(loader)
    text = "".join(traceback.format_exception(info.value))
    assert "failed on batch index 3" in text and "datasets.py" in text
    if use_multiprocessing:
        assert "the worker's traceback" in text
    loader.close()


@pytest.mark.timeout(60)
def test_a_worker_that_dies_ends_iteration_with_an_error():
    before = _shm_segments()
    loader = FastLoader(datasets.Dying(n=10), workers=2)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"exited with code 3 while loading batch index 4"):
        list(loader)
    assert time.monotonic() - start < 30
    assert not _workers()
    assert _shm_segments() <= before


def test_close_leaves_no_processes_or_shared_memory():
    before = _shm_segments()
    loader = FastLoader(datasets.Squares(n=6), workers=2)
    it = iter(loader)  # held: an iteration dropped midway stops the workers itself (test_loader_errors.py)
    next(it)
    assert len(_workers()) == 2
    assert len(_shm_segments() - before) == 1
    loader.close()
    assert not _workers()
    assert _shm_segments() <= before
    # A closed loader starts its workers again when used; each iteration is an epoch from its first batch.
    assert _ids(loader) == [0, 1, 2, 3, 4, 5]
    assert _ids(loader) == list(range(6))
    loader.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, r"workers=0; it must be a positive int"),
    ({"workers": 2.5}, r"workers=2.5"),
    ({"max_queue_size": -1}, r"max_queue_size=-1; it must be a positive int"),
    ({"use_multiprocessing": "yes"}, r"use_multiprocessing='yes'; pass True or False"),
])
def test_bad_arguments_say_what_was_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FastLoader(datasets.Squares(), **kwargs)


def test_dataset_without_len_is_rejected():
    with pytest.raises(TypeError, match=r"needs a dataset with __len__ and __getitem__.*got generator"):
        FastLoader(x for x in range(3))
    with pytest.raises(ValueError, match="length 0"):
        FastLoader(datasets.Squares(n=0))


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_inconsistent_batch_structure_is_a_type_error(use_multiprocessing):
    loader = FastLoader(datasets.Inconsistent(n=5), workers=2, use_multiprocessing=use_multiprocessing)
    with pytest.raises(TypeError, match=r"Batch index 2 of Inconsistent has structure \(array, array, array\)"):
        list(loader)
    loader.close()


def test_fit_trains_after_tensorflow_started_its_thread_pools():
    tf = pytest.importorskip("tensorflow", reason="TensorFlow's thread pools exist only where TensorFlow is installed")

    tf.reduce_sum(tf.random.normal((256, 256)) @ tf.random.normal((256, 256))).numpy()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with FastLoader(datasets.Regression(n=8), workers=2) as loader:
        history = model.fit(loader, epochs=4, verbose=0)
        assert len(history.history["loss"]) == 4
        assert history.history["loss"][-1] < 0.2 * history.history["loss"][0]
        # Keras's own probe of the first batches must not shift the epoch stream.
        assert _ids([(b[0][:1, :1] * 0 + i, None) for i, b in enumerate(loader)]) == list(range(8))


def test_fit_sees_every_batch_once_per_epoch():
    # A model that always predicts 0 (zero weights, zero learning rate): the loss of batch i is a known function of i,
    # so the per-epoch sum of losses proves which batches fit saw.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False)])
    model.compile(keras.optimizers.SGD(learning_rate=0.0), "mse")
    model.set_weights([np.zeros((3, 2), "float32")])
    history = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            history.append(batch)

    with FastLoader(datasets.Squares(n=6), workers=2, shuffle=True, seed=1) as loader:
        fit = model.fit(loader, epochs=2, verbose=0, callbacks=[Record()])
    expected = np.mean([(i**2 + i**4) / 2 for i in range(6)])
    np.testing.assert_allclose(fit.history["loss"], [expected, expected], rtol=1e-5)
    assert history == list(range(6)) * 2


def test_to_tf_dataset_yields_the_same_batches():
    pytest.importorskip("tensorflow", reason="to_tf_dataset() builds a tf.data.Dataset, so it needs TensorFlow")
    with FastLoader(datasets.Squares(n=5), workers=2) as loader:
        got = [(x.numpy(), y.numpy()) for x, y in loader.to_tf_dataset()]
    assert _ids(got) == list(range(5))


@pytest.mark.timeout(120)
def test_ctrl_c_during_fit_leaves_no_processes_or_shared_memory(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, keras\n"
        f"sys.path.insert(0, {os.path.join(REPO, 'tests')!r})\n"
        "import datasets\n"
        "from kfast.data import FastLoader\n"
        "if __name__ == '__main__':\n"
        "    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "    model.compile('sgd', 'mse')\n"
        "    loader = FastLoader(datasets.Squares(n=50, delay=0.05), workers=2)\n"
        "    class Started(keras.callbacks.Callback):\n"
        "        def on_epoch_begin(self, epoch, logs=None):\n"
        "            if epoch == 1:\n"
        "                print('training', flush=True)\n"
        "    model.fit(loader, epochs=100, verbose=0, callbacks=[Started()])\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    request_cleanup = proc.kill
    try:
        _interrupt_and_check(proc)
    finally:
        request_cleanup()
        proc.communicate()


def _interrupt_and_check(proc):
    # Interrupted in its second epoch, once its workers have delivered a whole epoch: a busy machine (CI runs
    # two test processes on two cores) took over a minute to start them, and a count taken before then
    # measured the machine, not the loader.
    assert proc.stdout.readline().strip() == "training"
    parent = psutil.Process(proc.pid)
    workers = _workers(parent)
    assert len(workers) >= 2, _tree(parent)
    descendants = parent.children(recursive=True)  # workers, fork server, resource tracker
    time.sleep(1.0)
    _, err = interrupt_and_wait(proc)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    gone, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, alive
    assert not _shm_segments(proc.pid)  # the training process's own segments, not this test process's


def test_batches_kept_by_the_caller_are_never_overwritten():
    # Batches are handed out without a copy, from shared-memory slots that are reused only once nobody
    # holds a batch (or a view of one) from them: kept batches must survive later epochs and close().
    data = datasets.EpochCounter(n=8)  # every epoch writes different values
    with FastLoader(data, workers=2, max_queue_size=2) as loader:
        kept = list(loader)
        views = [x[1:, :2] for x, _ in kept]
        for _ in range(3):
            assert len(list(loader)) == 8
    for i, ((x, y), view) in enumerate(zip(kept, views)):
        np.testing.assert_array_equal(x, np.full((4, 3), i, "float32"))
        np.testing.assert_array_equal(view, np.full((3, 2), i, "float32"))


def test_workers_do_not_run_an_unguarded_script_again(tmp_path):
    # No `if __name__ == "__main__":` guard: each worker used to import the script and run it again (under
    # horovodrun, a second hvd.init() in the worker, which aborts it).
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {os.path.join(REPO, 'tests')!r})\n"
        "import datasets\n"
        "from kfast.data import FastLoader\n"
        "with open('runs.txt', 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "with FastLoader(datasets.Squares(n=6), workers=2, use_multiprocessing=True) as loader:\n"
        "    print(sorted(int(x[0, 0]) for x, _ in loader))\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 1, 2, 3, 4, 5]"
    assert len((tmp_path / "runs.txt").read_text().split()) == 1
