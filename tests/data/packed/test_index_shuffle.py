"""The computed permutations behind a packed dataset's global shuffle (kfast.data.packed.index_shuffle)."""

import numpy as np
import pytest

from kfast.data.packed.index_shuffle import BlockShuffle, IndexShuffle


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4099])
def test_every_index_once_for_any_length(n):
    for epoch in range(3):
        order = IndexShuffle(n, seed=11, epoch=epoch)(np.arange(n))
        assert sorted(order.tolist()) == list(range(n))


def test_the_order_is_a_function_of_seed_and_epoch_read_at_any_position():
    n = 10_000
    whole = IndexShuffle(n, 5, 2)(np.arange(n))
    assert IndexShuffle(n, 5, 2)(np.arange(7_000, n)).tolist() == whole[7_000:].tolist()  # a resume, from the middle
    assert whole.tolist() != IndexShuffle(n, 5, 3)(np.arange(n)).tolist()
    assert whole.tolist() != IndexShuffle(n, 6, 2)(np.arange(n)).tolist()
    assert whole.tolist() != list(range(n))


def test_each_index_is_equally_likely_at_a_position():
    # Position 0 over 4,000 epochs: each of 8 indices about 500 times (a chi-square bound far from a fluke).
    counts = np.bincount([IndexShuffle(8, 1, e)(np.array([0]))[0] for e in range(4000)], minlength=8)
    chi2 = float(((counts - 500) ** 2 / 500).sum())
    assert chi2 < 30, counts  # 7 degrees of freedom: p < 1e-4 past 29


def test_positions_outside_the_range_are_refused():
    with pytest.raises(IndexError, match="0..9"):
        IndexShuffle(10, 0, 0)(np.array([10]))
    with pytest.raises(ValueError, match="n >= 1"):
        IndexShuffle(0, 0, 0)


def test_a_block_shuffle_reads_its_window_of_blocks_at_a_time():
    sizes = [100] * 9 + [37]
    shuffle = BlockShuffle(sizes, window=3, seed=4, epoch=0)
    order = shuffle(np.arange(shuffle.n))
    assert sorted(order.tolist()) == list(range(937))
    block = np.searchsorted(np.cumsum(sizes), order, side="right")
    # Consecutive windows of the epoch's block order: each window's positions come from its 3 blocks only.
    seen, at = [], 0
    while at < len(order):
        first = set(block[at:at + 1].tolist())
        window = []
        while at < len(order) and len(set(window) | {int(block[at])}) <= 3:
            window.append(int(block[at]))
            at += 1
        seen.append(set(window))
        assert first <= set(window)
    assert sum(len(s) for s in seen) == 10 and set().union(*seen) == set(range(10))
    assert order.tolist() != BlockShuffle(sizes, 3, 4, 1)(np.arange(937)).tolist()
