"""The loaders `field_bench.py` races, beyond those of `loader_bench.py`: Grain, tf.data's native JPEG
route and kfast's tuned and `fill_batch` variants, each for loader-only loops and for `model.fit`.

A loop builder takes `(ds, workers)` and returns `(one_epoch, close)` as in `loader_bench`. A fit feed
takes the same and returns `(data, steps, close)`: what to pass to `model.fit`, its `steps_per_epoch`
(None when `data` has a length) and what to call afterwards.
"""

import itertools

import numpy as np

import jpeg_workload
import loader_bench as lb
from kfast.data import FastLoader


class FilledImages(lb.ImageBatches):
    """W1 with `fill_batch`: FastLoader's workers write each batch straight into shared memory."""

    def fill_batch(self, index, out):
        self._check(index)
        x, y = out
        np.add(self.base, np.uint8(index % 7), out=x)
        y[:] = self._targets(index)


class GetitemOnly:
    """A dataset's `__len__` and `__getitem__` alone: FastLoader's route for datasets without `fill_batch`."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]


# ------------------------------------------------------------------------------------------------------
# Grain. Its MapDataset reads any sequence; `repeat()` keeps one iterator, and its worker processes,
# across epochs (a new iterator per epoch would spawn new processes, seconds each, every epoch).
# ------------------------------------------------------------------------------------------------------


def grain_dataset(ds, workers, processes):
    """The repeated Grain pipeline over `ds`: `workers` reader threads, or `mp_prefetch` processes."""
    import grain

    data = grain.MapDataset.source(ds).repeat()
    if not processes:
        return data.to_iter_dataset(grain.ReadOptions(num_threads=workers, prefetch_buffer_size=2 * workers))
    # In a worker the batches are computed in memory: Grain advises no reader threads then.
    data = data.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    return data.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2))


def _grain(ds, workers, processes):
    stream = iter(grain_dataset(ds, workers, processes))
    close = getattr(stream, "close", lambda: None)
    return lambda: itertools.islice(stream, len(ds)), close


def grain_threads(ds, workers):
    """Grain MapDataset read by `workers` threads."""
    return _grain(ds, workers, processes=False)


def grain_processes(ds, workers):
    """Grain MapDataset prefetched by `workers` processes (`mp_prefetch`, shared-memory arrays)."""
    return _grain(ds, workers, processes=True)


def tf_native(ds, workers):
    """W4's native tf.data pipeline (see `jpeg_workload.tf_native`)."""
    del workers
    return jpeg_workload.tf_native(ds).as_numpy_iterator, lambda: None


def kfast_getitem(ds, workers):
    """FastLoader processes on `__getitem__` alone (each batch built, then copied into shared memory)."""
    return lb.fast_processes(GetitemOnly(ds), workers)


def kfast_tuned(settings):
    """A builder of FastLoaders with the settings `kfast.tune` chose."""

    def build(ds, workers):
        del workers
        loader = FastLoader(ds, **settings)
        return lambda: iter(loader), loader.close

    return build


# ------------------------------------------------------------------------------------------------------
# model.fit feeds
# ------------------------------------------------------------------------------------------------------


def _nothing():
    pass


def fit_plain(ds, workers):
    del workers
    return ds, None, _nothing


def _fit_keras(ds, workers, processes):
    ds.workers, ds.use_multiprocessing = workers, processes

    def close():
        ds.workers, ds.use_multiprocessing = 1, False  # the dataset is shared with the other rows

    return ds, None, close


def fit_keras_threads(ds, workers):
    return _fit_keras(ds, workers, processes=False)


def fit_keras_processes(ds, workers):
    return _fit_keras(ds, workers, processes=True)


def _fit_tf(make):
    # Repeated, with steps_per_epoch: Keras cannot count a generator's batches, and would warn at the end of
    # every epoch that the input ran out.
    def feed(ds, workers):
        del workers
        return make(ds).repeat(), len(ds), _nothing

    return feed


fit_tf_generator = _fit_tf(lb.tf_generator_dataset)
fit_tf_map = _fit_tf(lb.tf_parallel_map_dataset)
fit_tf_native = _fit_tf(jpeg_workload.tf_native)


def fit_grain_threads(ds, workers):
    return grain_dataset(ds, workers, processes=False), len(ds), _nothing


def fit_grain_processes(ds, workers):
    return grain_dataset(ds, workers, processes=True), len(ds), _nothing


def fit_kfast(**settings):
    """A fit feed of FastLoaders with `settings` (the `workers` argument fills in a missing count)."""

    def feed(ds, workers):
        loader = FastLoader(ds, **{"workers": workers, **settings})
        return loader, None, loader.close

    return feed
