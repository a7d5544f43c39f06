"""FastLoader's `fill_batch(index, out)` route: datasets write batches straight into the memory they travel in."""

import traceback

import numpy as np
import pytest

import datasets
from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import shard

MODES = [pytest.param(True, id="processes"), pytest.param(False, id="threads")]


@pytest.mark.parametrize("use_multiprocessing", MODES)
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_array_dataset_batches_equal_its_getitem(use_multiprocessing, shuffle):
    # 103 samples in batches of 10: the last batch is short (3 samples). A shuffled dataset draws a new
    # order every epoch (set_epoch), which the reference copy follows.
    ds, ref = (ArrayDataset(*datasets.mixed_arrays(), batch_size=10, shuffle=shuffle, seed=5) for _ in range(2))
    with FastLoader(ds, workers=2, use_multiprocessing=use_multiprocessing) as loader:
        for epoch in range(2):
            ref.set_epoch(epoch)
            want = [ref[i] for i in range(len(ref))]
            got = [batch for batch in loader]
            assert len(got) == 11 and len(got[-1][1]) == 3
            assert all(datasets.same_xyw(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_shuffled_loader_that_starts_with_the_short_batch(use_multiprocessing):
    # FastLoader's order is a seeded permutation; this seed puts the short last batch first, while
    # fill_batch's arrays stay shaped like batch 0, a whole one.
    n = 11
    seed = next(s for s in range(1000) if np.random.default_rng([s, 0]).permutation(n)[0] == n - 1)
    ds = ArrayDataset(*datasets.mixed_arrays(), batch_size=10)
    with FastLoader(ds, workers=2, use_multiprocessing=use_multiprocessing, shuffle=True, seed=seed) as loader:
        got = list(loader)
    assert len(got[0][1]) == 3
    assert sorted(int(y[0]) // 10 for _, y, _ in got) == list(range(n))
    assert all(datasets.same_xyw(g, ds[int(g[1][0]) // 10]) for g in got)


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_every_batch_after_the_first_comes_from_fill_batch(use_multiprocessing):
    with FastLoader(datasets.FillsOnly(n=7), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        got = [(x.copy(), y.copy()) for x, y in loader]  # copies: each slot goes back as its batch is dropped
        if use_multiprocessing:  # the first ones, asked for before the slots were made, travel pickled
            assert loader._stream._pool.shm_batches >= 3 and loader._stream._pool.shm_batches + loader._stream._pool.pickled_batches == 7
    assert [int(x[0, 0]) for x, _ in got] == list(range(7))
    assert [len(x) for x, _ in got] == [4] * 6 + [2]
    assert all(np.array_equal(y, np.tile([i, i * i], (len(y), 1))) for i, (_, y) in enumerate(got))


def test_batches_held_past_the_ring_are_filled_and_pickled():
    # Holding every batch keeps every slot lent: later batches are filled into fresh arrays and pickled.
    with FastLoader(datasets.FillsOnly(n=12), workers=2, max_queue_size=2) as loader:
        got = list(loader)
        assert loader._stream._pool.pickled_batches > 0
    assert [int(x[0, 0]) for x, _ in got] == list(range(12))


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_an_error_in_fill_batch_reaches_the_caller_with_its_traceback(use_multiprocessing):
    loader = FastLoader(datasets.FillsOnly(n=8, bad=3), workers=2, use_multiprocessing=use_multiprocessing)
    with pytest.raises(ValueError, match="cannot decode record 3 into the slot") as info:  # its own type
        list(loader)
    text = "".join(traceback.format_exception(info.value))
    assert "failed on batch index 3" in text
    if use_multiprocessing:
        assert "Traceback" in text and "(pid " in text
    assert "in fill_batch" in text and "datasets.py" in text
    loader.close()


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_fill_batch_returning_a_bad_count_is_an_error(use_multiprocessing):
    loader = FastLoader(datasets.FillsOnly(n=4, returns=9), workers=1, use_multiprocessing=use_multiprocessing)
    with pytest.raises(ValueError, match="fill_batch") as info:
        list(loader)
    text = "".join(traceback.format_exception(info.value))
    assert "failed on batch index" in text
    assert "of FillsOnly returned 9" in text and "an int from 1 to 4" in text
    loader.close()


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_shard_fills_its_own_batches(use_multiprocessing):
    ds = ArrayDataset(*datasets.mixed_arrays(), batch_size=10)
    part = shard(ds, rank=1, size=3)
    with FastLoader(part, workers=2, use_multiprocessing=use_multiprocessing) as loader:
        got = list(loader)
    assert [int(y[0]) for _, y, _ in got] == [10, 40, 70]
    assert all(datasets.same_xyw(g, ds[i]) for g, i in zip(got, (1, 4, 7)))


def test_a_shard_of_a_dataset_without_fill_batch_has_none():
    assert not hasattr(shard(datasets.Squares(n=4), rank=0, size=2), "fill_batch")
    assert callable(shard(datasets.FillsOnly(n=4), rank=0, size=2).fill_batch)
