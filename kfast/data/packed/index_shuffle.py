"""A permutation of `range(n)` that is computed, not stored: the order of an epoch of millions of samples in O(1)
memory, keyed by (seed, epoch), read at any position (so a resumed epoch starts where it stopped at no cost).

NOTE [ Index shuffle ]
A four-round Feistel network is a bijection on 2h-bit integers for any round function; with a keyed mix as the
round function it behaves as a random permutation (Luby-Rackoff: three rounds suffice). For n that is not a power
of four, cycle walking applies the network again until the value falls below n: a bijection of `range(n)` in at
most a few walks (the domain is under 4n). Grain shuffles its global index the same way (TensorFlow's
`random_index_shuffle`); Python's `random.shuffle` would need the whole list, 80 MB at ten million samples per
process, rebuilt every epoch.

`BlockShuffle` keeps reads local: whole blocks (a pack's shards) are put in a random order, and samples are
mixed within each window of `window` consecutive blocks of that order, so a reader has `window` shards open at a
time; it stores the block order, O(blocks), not O(samples) (MosaicML Streaming's py1e shuffle has the same aim).
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64's finaliser


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    z = x ^ key
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _keys(seed: int, epoch: int, salt: int) -> list[np.uint64]:
    words = np.random.SeedSequence([int(seed), int(epoch), int(salt)]).generate_state(_ROUNDS, dtype=np.uint64)
    return [np.uint64(w) for w in words]


class IndexShuffle:
    """A pseudo-random permutation of `range(n)` keyed by (seed, epoch, salt); `shuffle(positions)` maps positions
    to indices, `positions` any integer array.

    Args:
        n: the length permuted (n >= 1).
        seed: the key's seed (an int >= 0).
        epoch: the epoch (another key word: every epoch its own permutation).
        salt: a third key word, for independent permutations under one (seed, epoch). Defaults to `0`.

    Example:

    >>> shuffle = IndexShuffle(10, seed=7, epoch=0)
    >>> order = shuffle(np.arange(10))
    >>> sorted(order.tolist()) == list(range(10)), order.tolist() == IndexShuffle(10, 7, 0)(np.arange(10)).tolist()
    (True, True)
    """

    def __init__(self, n: int, seed: int, epoch: int, salt: int = 0) -> None:
        if n < 1:
            raise ValueError(f"IndexShuffle got n={n}; it permutes range(n) for n >= 1.")
        self.n = n
        self._half = max(1, ((n - 1).bit_length() + 1) // 2)
        self._mask = np.uint64((1 << self._half) - 1)
        self._keys = _keys(seed, epoch, salt)

    def _network(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self._half)
        left, right = x >> h, x & self._mask
        with np.errstate(over="ignore"):  # the mix multiplies modulo 2**64 on purpose
            for key in self._keys:
                left, right = right, left ^ (_mix(right, key) & self._mask)
        return (left << h) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"IndexShuffle of {self.n} got positions outside 0..{self.n - 1}.")
        x = self._network(positions.astype(np.uint64))
        n = np.uint64(self.n)
        for _ in range(64):  # each walk leaves at least 1/4 of the values to walk again: 64 walks never run out
            out = x >= n
            if not out.any():
                return x.astype(np.int64)
            x[out] = self._network(x[out])
        raise AssertionError("cycle walking did not end")  # unreachable: see NOTE [ Index shuffle ]


class BlockShuffle:
    """An order of `range(sum(block_sizes))` that reads `window` blocks at a time: blocks in a random order (by
    (seed, epoch)), samples mixed within each window of `window` consecutive blocks of that order.

    Args:
        block_sizes: samples per block, in index order (block b covers the indices after blocks 0..b-1).
        window: blocks mixed together (>= 1).
        seed: the order's seed.
        epoch: the epoch.

    Example:

    >>> order = BlockShuffle([4, 4, 4, 3], window=2, seed=1, epoch=0)(np.arange(15))
    >>> sorted(order.tolist()) == list(range(15)), len({int(i) // 4 for i in order[:8]})
    (True, 2)
    """

    def __init__(self, block_sizes: list[int], window: int, seed: int, epoch: int) -> None:
        if window < 1:
            raise ValueError(f"BlockShuffle got window={window}; it mixes at least one block at a time.")
        sizes = np.asarray(block_sizes, dtype=np.int64)
        self.n = int(sizes.sum())
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        blocks = np.random.default_rng([seed, epoch, 1]).permutation(len(sizes))
        self._starts, self._sizes = starts[blocks], sizes[blocks]  # in the epoch's block order
        self._ends = np.cumsum(self._sizes)  # where each block of that order ends, in positions
        self._window, self._seed, self._epoch = window, seed, epoch
        windows = len(sizes) // window + (len(sizes) % window > 0)
        self._window_ends = self._ends[np.minimum(np.arange(1, windows + 1) * window, len(sizes)) - 1]

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"BlockShuffle of {self.n} got positions outside 0..{self.n - 1}.")
        out = np.empty_like(positions)
        which = np.searchsorted(self._window_ends, positions, side="right")
        for w in np.unique(which):
            mask = which == w
            begin = int(self._window_ends[w - 1]) if w else 0
            mixed = IndexShuffle(int(self._window_ends[w]) - begin, self._seed, self._epoch, salt=2 + int(w))
            p = begin + mixed(positions[mask] - begin)  # a position of this window, mixed
            block = np.searchsorted(self._ends, p, side="right")
            out[mask] = self._starts[block] + p - (self._ends[block] - self._sizes[block])
        return out
