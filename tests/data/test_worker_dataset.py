"""The `worker_dataset()` protocol: worker processes load a dataset's lighter form, and never TensorFlow for
kfast's own datasets."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import datasets
from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import ShardedDataset
from kfast.data import shard
from kfast.data.array_batches import ArrayBatches

# Runs in a fresh interpreter: the fork server is started once per process and keeps the modules it
# preloaded, so one started by an earlier test (for a dataset whose module imports Keras) would map
# TensorFlow whatever this loader sends. Like a training script, it imports Keras (and TensorFlow) itself.
_CHILD = textwrap.dedent("""
    import os, pickle, sys
    import numpy as np
    from kfast.data import ArrayDataset, FastLoader, shard

    def tensorflow_files(pid):
        with open(f"/proc/{pid}/maps") as f:
            return sorted({line.split()[-1] for line in f if "tensorflow" in line})

    def parent(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the command name

    arrays, sharded = pickle.load(open("input.pkl", "rb"))
    data = ArrayDataset(*arrays, batch_size=10, shuffle=True, seed=5)
    if sharded:
        data = shard(data, rank=1, size=2)
    with FastLoader(data, workers=2, use_multiprocessing=True) as loader:
        epochs = [list(loader) for _ in range(2)]
        pids = [p.pid for p in loader._stream._pool._processes]
        servers = {parent(pid) for pid in pids}
        with open(f"/proc/{min(servers)}/cmdline", "rb") as f:
            server_cmdline = f.read().decode(errors="replace")
        report = {"epochs": epochs, "parent": tensorflow_files(os.getpid()),
                  "workers": {pid: tensorflow_files(pid) for pid in pids},
                  "servers": {pid: tensorflow_files(pid) for pid in servers}, "server_cmdline": server_cmdline}
    pickle.dump(report, open("report.pkl", "wb"))
""")


def _dataset(sharded):
    data = ArrayDataset(*datasets.mixed_arrays(), batch_size=10, shuffle=True, seed=5)
    return shard(data, rank=1, size=2) if sharded else data


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sharded", [False, True], ids=["array-dataset", "shard-of-array-dataset"])
def test_worker_processes_serve_the_same_batches_without_tensorflow(sharded, tmp_path):
    with open(tmp_path / "input.pkl", "wb") as f:
        pickle.dump((datasets.mixed_arrays(), sharded), f)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=tmp_path, capture_output=True, text=True,
                          timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "report.pkl", "rb") as f:
        report = pickle.load(f)

    # The check can see TensorFlow: the training process has it mapped. Its workers and their fork server don't.
    assert report["parent"]
    assert len(report["workers"]) == 2 and not any(report["workers"].values()), report["workers"]
    assert len(report["servers"]) == 1 and "forkserver" in report["server_cmdline"]
    assert not any(report["servers"].values()), report["servers"]

    reference = _dataset(sharded)
    with FastLoader(_dataset(sharded), workers=2, use_multiprocessing=False) as threads:
        for epoch, got in enumerate(report["epochs"]):
            reference.set_epoch(epoch)
            want = [reference[i] for i in range(len(reference))]
            assert len(got) == len(want) == (5 if sharded else 11)
            assert all(datasets.same_xyw(g, w) for g, w in zip(got, want))
            assert all(datasets.same_xyw(g, w) for g, w in zip(got, threads))


def test_a_shard_s_worker_form_serves_the_shard_s_batches():
    part = _dataset(sharded=True)
    worker = part.worker_dataset()
    assert isinstance(worker, ShardedDataset) and isinstance(worker.dataset, ArrayBatches)
    # Not the wrapped dataset's worker form (what ShardedDataset.__getattr__ would forward to): all 11 batches.
    assert len(worker) == len(part) == 5 and len(part.dataset.worker_dataset()) == 11
    assert (worker.rank, worker.size, worker.mode, worker.start) == (1, 2, "drop", 0)
    for epoch in range(2):
        part.set_epoch(epoch)
        worker.set_epoch(epoch)
        assert all(datasets.same_xyw(worker[i], part[i]) for i in range(5))


def test_a_shard_of_a_dataset_without_a_worker_form_is_its_own():
    part = shard(datasets.Squares(n=4), rank=0, size=2)
    assert part.worker_dataset() is part


class _Forwarding:
    """A wrapper that forwards unknown attributes, worker_dataset() included, and serves every other batch."""

    def __init__(self, dataset):
        self.inner = dataset

    def __len__(self):
        return len(self.inner) // 2

    def __getitem__(self, i):
        return self.inner[2 * i]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_worker_form_of_another_length_is_refused():
    loader = FastLoader(_Forwarding(ArrayDataset(np.zeros((40, 2)), batch_size=10)), workers=1)
    with pytest.raises(ValueError, match=r"_Forwarding.worker_dataset\(\) returned a ArrayBatches of 4 batches, "
                                         r"but the _Forwarding has 2.*needs a worker_dataset\(\) of its own"):
        next(iter(loader))
    loader.close()


class _Epochs:
    """Shuffles per epoch (set_epoch), but its worker form, a list of its batches, cannot."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return np.full(2, i)

    def set_epoch(self, epoch):
        pass

    def worker_dataset(self):
        return [self[i] for i in range(2)]


def test_a_worker_form_without_set_epoch_is_refused():
    loader = FastLoader(_Epochs(), workers=1)
    with pytest.raises(TypeError, match=r"_Epochs.worker_dataset\(\) returned a list, which lacks set_epoch"):
        next(iter(loader))
    loader.close()


@pytest.mark.parametrize("use_multiprocessing, marks", [(True, [1000, 1001]), (False, [0, 1])],
                         ids=["processes", "threads"])
def test_workers_load_the_worker_form_made_after_each_epoch_hook(use_multiprocessing, marks):
    # Tagged's worker form marks its batches: processes serve it, threads the dataset itself. After
    # on_epoch_end the loader sends the workers the dataset's new worker form.
    with FastLoader(datasets.Tagged(n=4), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        for mark in marks:
            batches = list(loader)
            assert [int(x[0, 0]) for x, _ in batches] == [0, 1, 2, 3]
            assert all((y == mark).all() for _, y in batches)
