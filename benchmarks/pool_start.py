"""Pool start: seconds from building a multiprocessing loader to its first batch, in a fresh process.

The first pool of a training process pays for whatever its workers import. Each measurement runs in a
fresh interpreter that has imported Keras (and so TensorFlow) first, as a training script has, then
times building the loader and taking its first batch of `zeros((1024, 32), float32)` in batches of 64,
with 2 worker processes:

    kfast-array      FastLoader over kfast.data.ArrayDataset (its workers load the keras-free
                     `worker_dataset()`, ArrayBatches)
    kfast-shard      FastLoader over shard(ArrayDataset, rank=1, size=2)
    kfast-pydataset  FastLoader over a keras.utils.PyDataset subclass defined in a module that imports
                     Keras, as users' datasets are (`KerasArrays` below): its workers import Keras
    keras            that PyDataset with workers=2, use_multiprocessing=True, read through Keras's own
                     PyDatasetAdapter as `model.fit` reads it; its `multiprocessing.Pool` forks the
                     training process itself (Linux's default), the quickest start, and the one that
                     can deadlock once TensorFlow's threads run, which kfast's fork server avoids
    grain            Grain `mp_prefetch` with 2 processes over ArrayBatches (when grain is installed)

It also times `import keras` in a fresh interpreter, prints medians over `--repeats` runs and each
loader's ratio to kfast-array. About a minute on 2 cores:

    python benchmarks/pool_start.py [--repeats 3]
"""

import os

# Set before TensorFlow is imported (here and in the fresh interpreters, which inherit the environment).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("kfast-array", "kfast-shard", "kfast-pydataset", "keras", "grain")


class KerasArrays(keras.utils.PyDataset):
    """Batches of `x` as a user writes them: a PyDataset in a module that imports Keras."""

    def __init__(self, x, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.batch_size = x, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        return self.x[index * self.batch_size:(index + 1) * self.batch_size]


def _kfast(dataset):
    from kfast.data import FastLoader

    loader = FastLoader(dataset, workers=2, use_multiprocessing=True)
    return iter(loader), loader.close


def _keras(x):
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(KerasArrays(x, 64, workers=2, use_multiprocessing=True), shuffle=False)
    adapter.on_epoch_begin()
    return iter(adapter.get_numpy_iterator()), adapter.on_epoch_end


def _grain(x):
    import grain

    from kfast.data.array_batches import ArrayBatches

    # As benchmarks/field_loaders.py builds it: no reader threads inside the worker processes.
    data = grain.MapDataset.source(ArrayBatches(x, batch_size=64)).to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    stream = iter(data.mp_prefetch(grain.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2)))
    return stream, getattr(stream, "close", lambda: None)


def _build(case, x):
    from kfast.data import ArrayDataset, shard

    if case == "kfast-array":
        return _kfast(ArrayDataset(x, batch_size=64))
    if case == "kfast-shard":
        return _kfast(shard(ArrayDataset(x, batch_size=64), rank=1, size=2))
    if case == "kfast-pydataset":
        return _kfast(KerasArrays(x, 64))
    if case == "keras":
        return _keras(x)
    return _grain(x)


def measure(case):
    """Prints the seconds from building `case`'s loader to its first batch (run in a fresh interpreter)."""
    x = np.zeros((1024, 32), np.float32)
    start = time.perf_counter()
    stream, close = _build(case, x)
    batch = next(stream)
    seconds = time.perf_counter() - start
    first = keras.tree.flatten(batch)[0]  # Keras's adapter hands out a 1-tuple
    assert np.shape(first) == (64, 32), np.shape(first)
    close()
    print(json.dumps({"seconds": seconds}))


def _fresh(code):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the measurement failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def _import_keras():
    # `import keras` alone: what each worker of a Keras-importing dataset pays before its first batch.
    return _fresh("import json, time; start = time.perf_counter(); import keras; "
                  "print(json.dumps({'seconds': time.perf_counter() - start}))")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per loader (median reported)")
    args = parser.parse_args()
    cases = [c for c in CASES if c != "grain" or importlib.util.find_spec("grain") is not None]
    if "grain" not in cases:
        print("grain is not installed: its row is left out.")
    times = {"import keras": [_import_keras() for _ in range(args.repeats)]}
    for case in cases:
        # `import keras` first, as a training script has, so only the loader's own start is timed.
        code = f"import keras, pool_start; pool_start.measure({case!r})"
        times[case] = [_fresh(code) for _ in range(args.repeats)]
    base = statistics.median(times["kfast-array"])
    print(f"\nbuild to first batch, 2 worker processes, fresh interpreter; median of {args.repeats}")
    print(f"{'loader':<18}{'median s':>10}{'x kfast-array':>15}   runs (s)")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"{name:<18}{median:>10.3f}{median / base:>15.1f}   {' '.join(f'{r:.3f}' for r in runs)}")


if __name__ == "__main__":
    main()
