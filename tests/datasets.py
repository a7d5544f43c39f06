"""Datasets for the loader tests. They live in an importable module because spawned worker processes
must import their classes."""

import os
import time

import keras
import numpy as np


class Squares(keras.utils.PyDataset):
    """Batch i: x = full((4, 3), i) float32, y = rows of [i, i^2] int64. Its values name its index."""

    def __init__(self, n=10, delay=0.0, **kwargs):
        super().__init__(**kwargs)
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return np.full((4, 3), i, "float32"), np.tile(np.array([i, i * i], "int64"), (4, 1))


class Plain:
    """Not a PyDataset: dict batches with a string leaf (pickled path)."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return {"x": np.arange(6, dtype="int32").reshape(2, 3) + i, "name": f"batch-{i}"}


class Failing(Squares):
    """Raises on one index."""

    def __init__(self, bad=3, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"cannot decode record {i}")
        return super().__getitem__(i)


class AllFailing(Squares):
    """Raises on every index."""

    def __getitem__(self, i):
        raise NotImplementedError(f"batch {i} is broken")


class SomeFailing(Squares):
    """Raises on indices 2 and 5."""

    def __getitem__(self, i):
        if i in (2, 5):
            raise ValueError(f"cannot decode batch {i}")
        return super().__getitem__(i)


class Dying(Squares):
    """The worker process exits abruptly on one index."""

    def __getitem__(self, i):
        if i == 4:
            os._exit(3)
        return super().__getitem__(i)


class Inconsistent(Squares):
    """Batch 2 has a different structure."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x, y, y) if i == 2 else (x, y)


class EpochCounter(Squares):
    """on_epoch_end changes what batches hold: x = index + 100 * epochs_ended."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ended = 0

    def on_epoch_end(self):
        self.ended += 1

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x + 100 * self.ended, y


class Regression(keras.utils.PyDataset):
    """A learnable task y = x @ w, batch i drawn from a fixed seed."""

    def __init__(self, n=8, batch_size=16, **kwargs):
        super().__init__(**kwargs)
        self.n, self.batch_size = n, batch_size
        self.w = np.random.default_rng(0).normal(size=(4, 1)).astype("float32")

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.random.default_rng(i).normal(size=(self.batch_size, 4)).astype("float32")
        return x, x @ self.w


class Growing(Squares):
    """Later batches are larger than the first (they overflow the shared-memory slots)."""

    def __getitem__(self, i):
        return np.full((4 + i, 3), i, "float32"), np.full((4 + i, 2), i, "int64")


class Features(keras.utils.PyDataset):
    """Batches of `width` features and 1 target; `delay` seconds of sleep per batch makes input slow."""

    def __init__(self, n=40, batch_size=32, width=8, delay=0.0, **kwargs):
        super().__init__(**kwargs)
        self.n, self.delay = n, delay
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(batch_size, width)).astype("float32")
        self.y = self.x.sum(axis=1, keepdims=True)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x + np.float32(i % 3), self.y


class Stuck(Squares):
    """Batch `stuck` never returns (it notes in `marker` that it began); the others are quick."""

    def __init__(self, n=6, stuck=2, marker=None, **kwargs):
        super().__init__(n=n, **kwargs)
        self.stuck, self.marker = stuck, marker

    def __getitem__(self, i):
        if i == self.stuck:
            if self.marker:
                with open(self.marker, "w") as f:
                    f.write(str(os.getpid()))
            while True:
                time.sleep(0.05)
        return super().__getitem__(i)


class Draws(Squares):
    """Each batch holds draws from numpy's and Python's global generators, as augmentation code makes."""

    def __getitem__(self, i):
        import random

        return np.array([np.random.randint(2**31), random.randrange(2**31)], "int64"), np.full(2, i, "int64")


class Sized(Squares):
    """Batch i has rows[i] rows: to size shared-memory slots by a batch other than the first."""

    def __init__(self, rows, **kwargs):
        super().__init__(n=len(rows), **kwargs)
        self.rows = rows

    def __getitem__(self, i):
        return np.full((self.rows[i], 3), i, "float32"), np.full((self.rows[i], 2), i, "int64")


class Big(Squares):
    """Batches of `mib` MiB each."""

    def __init__(self, n=6, mib=0.25, **kwargs):
        super().__init__(n=n, **kwargs)
        self.rows = int(mib * 2**20 / 12)

    def __getitem__(self, i):
        return np.full((self.rows, 3), i, "float32"), np.full((self.rows,), i, "int64")


class ReorderedKeys(Squares):
    """Dict batches whose keys come in a different order every other batch (Keras accepts that)."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return ({"a": x, "b": x + 1} if i % 2 else {"b": x + 1, "a": x}), y


class CountedBatches(keras.utils.PyDataset):
    """A PyDataset that gives `num_batches` instead of `__len__`, with sample weights, recording its hooks."""

    def __init__(self, n=4, **kwargs):
        super().__init__(**kwargs)
        self.n, self.hooks = n, []

    @property
    def num_batches(self):
        return self.n

    def __getitem__(self, i):
        x = np.full((4, 3), i, "float32")
        return x, x[:, :1], np.ones(4, "float32")

    def on_epoch_begin(self):
        self.hooks.append("begin")

    def on_epoch_end(self):
        self.hooks.append("end")


class FillsOnly(Squares):
    """Squares written by `fill_batch`: `__getitem__` serves batch 0 alone (FastLoader's template), so every
    other batch proves the fill path ran. The last batch holds 2 samples; `fill_batch` raises on `bad` and
    returns `returns` (instead of the sample count) when given."""

    def __init__(self, n=10, bad=None, returns=None, **kwargs):
        super().__init__(n, **kwargs)
        self.bad, self.returns = bad, returns

    def __getitem__(self, i):
        if i != 0:
            raise AssertionError(f"FastLoader asked __getitem__ for batch {i} instead of calling fill_batch")
        return super().__getitem__(i)

    def fill_batch(self, i, out):
        if i == self.bad:
            raise ValueError(f"cannot decode record {i} into the slot")
        rows = 2 if i == self.n - 1 else 4
        x, y = out
        x[:rows] = i
        y[:rows] = [i, i * i]
        return self.returns if self.returns is not None else rows


class Tagged(keras.utils.PyDataset):
    """Batch i: x = full((2, 2), i) float32, y = full(2, e) int64, e the epochs ended so far (on_epoch_end).

    Its `worker_dataset()`, `TaggedInWorker`, deliberately serves y = 1000 + e instead, so a test can tell
    which form served a batch, and whether the workers got the form made after the last epoch hook."""

    def __init__(self, n=4, **kwargs):
        super().__init__(**kwargs)
        self.n, self.ends = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 2), i, "float32"), np.full(2, self.ends, "int64")

    def on_epoch_end(self):
        self.ends += 1

    def worker_dataset(self):
        return TaggedInWorker(self.n, self.ends)


class TaggedInWorker:
    """`Tagged`'s worker form: the same x, y marked with 1000 + the epochs ended when it was made."""

    def __init__(self, n, ends):
        self.n, self.ends = n, ends

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 2), i, "float32"), np.full(2, 1000 + self.ends, "int64")


def mixed_arrays(n=103):
    """(x, y, sample_weight) for ArrayDataset tests: x a dict of uint8 images and float64 features."""
    rng = np.random.default_rng(0)
    x = {"image": rng.integers(0, 255, (n, 6, 5, 3), dtype=np.uint8), "meta": rng.standard_normal((n, 4))}
    return x, np.arange(n, dtype=np.int64), rng.random(n).astype(np.float32)


def same_xyw(got, want):
    """Whether two (x, y, sample_weight) batches of `mixed_arrays` are equal, dtypes included."""
    (gx, gy, gw), (wx, wy, ww) = got, want
    return (sorted(gx) == sorted(wx) and all(np.array_equal(gx[k], wx[k]) and gx[k].dtype == wx[k].dtype for k in wx)
            and np.array_equal(gy, wy) and np.array_equal(gw, ww))


class CrashesAt(Squares):
    """Batch `at` crashes the process loading it: `how` is "segfault" (a read of address 0) or "exit"
    (`sys.exit(123)`)."""

    def __init__(self, at=0, how="segfault", **kwargs):
        super().__init__(**kwargs)
        self.at, self.how = at, how

    def __getitem__(self, i):
        if i == self.at:
            if self.how == "segfault":
                import ctypes

                ctypes.string_at(0)
            import sys

            sys.exit(123)
        return super().__getitem__(i)


class SlowFirst(Squares):
    """Batch 0 takes `delay` seconds; the others are quick."""

    def __getitem__(self, i):
        if i == 0:
            time.sleep(self.delay)
        return np.full((4, 3), i, "float32"), np.tile(np.array([i, i * i], "int64"), (4, 1))


class NeedsSetEpoch(Squares):
    """Serves batches only after `set_epoch` ran (where the batches are loaded): it opens its source there."""

    def set_epoch(self, epoch):
        self.opened_for = epoch

    def __getitem__(self, i):
        return super().__getitem__(i) if hasattr(self, "opened_for") else self.opened_for  # AttributeError


class WhereLoaded(Squares):
    """Batch i holds the pid of the process that loaded it in x[0, 0]."""

    def __getitem__(self, i):
        return np.full((4, 3), os.getpid(), "int64"), np.full((4, 1), i, "int64")


class BrokenInWorkers(Squares):
    """Cannot be rebuilt in a worker process: unpickling it raises."""

    def __reduce__(self):
        return (_refuse_to_unpickle, ("the source file of BrokenInWorkers is missing on this host",))


def _refuse_to_unpickle(reason):
    raise FileNotFoundError(reason)


class RaisesUnpicklable(Squares):
    """Batch `bad` raises an exception whose class cannot travel between processes (it holds a lock)."""

    def __init__(self, bad=2, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            import threading

            error = RuntimeError("decoder state lost")
            error.lock = threading.Lock()
            raise error
        return super().__getitem__(i)


class GrowsSlowStart(Squares):
    """Every batch is larger than the one before, and every worker but the first to start takes `delay`
    seconds to unpickle it: the first worker makes the slots grow several times before the others attach."""

    def __init__(self, marker, delay=2.0, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.delay = marker, delay

    def __setstate__(self, state):
        self.__dict__.update(state)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            time.sleep(self.delay)

    def __getitem__(self, i):
        return np.full((64 * (i + 1), 3), i, "float32"), np.full((64 * (i + 1), 1), i, "int64")


Pair = __import__("collections").namedtuple("Pair", ["features", "label"])


class NamedPairs(Squares):
    """Batches as a namedtuple `Pair(features, label)`."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return Pair(x, y)


class SizedFills(Sized):
    """`Sized` with `fill_batch`: batch i's rows written into arrays shaped like batch 0's (`rows[0]` rows,
    the most of any batch here), 300 float32 features so that one batch spans more than a page."""

    def __getitem__(self, i):
        return np.full((self.rows[i], 300), i, "float32"), np.full((self.rows[i], 2), i, "int64")

    def fill_batch(self, i, out):
        x, y = out
        x[:self.rows[i]], y[:self.rows[i]] = i, i
        return self.rows[i]
