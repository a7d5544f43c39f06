"""ArrayBatches, ArrayDataset's keras-free core: the same batches and errors, without importing Keras."""

import collections
import subprocess
import sys

import keras
import numpy as np
import pytest

from kfast.data import ArrayDataset
from kfast.data.array_batches import ArrayBatches

Pair = collections.namedtuple("Pair", "left right")


def _nested(n=23):
    rng = np.random.default_rng(1)
    x = {"z": rng.standard_normal((n, 3)), "a": [np.arange(n), Pair(np.arange(n) * 2, rng.random((n, 2, 2)))]}
    return x, np.arange(n, dtype=np.int64) % 3


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_batches_keep_the_nesting_keras_tree_keeps(shuffle):
    x, y = _nested()
    data = ArrayDataset(x, y, batch_size=5, shuffle=shuffle, seed=2)
    assert data.worker_dataset() is data._batches and isinstance(data.worker_dataset(), ArrayBatches)
    assert (len(data), data.num_samples, data.batch_size, data.shuffle, data.seed) == (5, 23, 5, shuffle, 2)
    for epoch in range(2):
        data.set_epoch(epoch)
        order = np.random.default_rng([2, epoch]).permutation(23) if shuffle else np.arange(23)
        for i in range(len(data)):
            rows = np.sort(order[i * 5:(i + 1) * 5])
            want = keras.tree.map_structure(lambda a: a[rows], (x, y))
            got = data[i]
            assert list(got[0]) == ["z", "a"] and type(got[0]["a"][1]) is Pair
            keras.tree.assert_same_structure(got, want)
            assert all(np.array_equal(g, w) for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want)))


def test_fill_batch_writes_the_batch_getitem_serves():
    x, y = _nested()
    data = ArrayDataset(x, y, batch_size=5, shuffle=True)
    out = keras.tree.map_structure(np.zeros_like, data[0])
    assert data.fill_batch(4, out) == 3  # 23 samples: the last batch holds 3
    want = data[4]
    assert all(np.array_equal(o[:3], w) for o, w in zip(keras.tree.flatten(out), keras.tree.flatten(want)))


@pytest.mark.parametrize("call, match", [
    (lambda: ArrayDataset(np.zeros(4), batch_size=0), r"ArrayDataset got batch_size=0; it must be a positive int"),
    (lambda: ArrayDataset(np.zeros(4), np.zeros(3)), r"ArrayDataset got arrays with first dimensions \[3, 4\]"),
    (lambda: ArrayDataset(np.zeros(4), batch_size=2).fill_batch(2, np.zeros(2)),
     r"ArrayDataset index 2 is out of range for 2 batches"),
    (lambda: ArrayBatches(np.zeros((0, 2))), r"ArrayBatches got arrays with first dimensions \[0\]"),
])
def test_errors_name_the_class_the_user_made(call, match):
    with pytest.raises((ValueError, IndexError), match=match):
        call()


def test_array_batches_import_numpy_and_kfast_helpers_only():
    code = ("import sys, kfast.data.array_batches\n"
            "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
