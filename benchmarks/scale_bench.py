"""Loaders at scale: many small image files and many packed samples, read by kfast and by its peers.

The script makes the data once under `--data` (reused by later runs of the same sizes):

    files-N/    N JPEG files (32x32, about 1 KB each) in 10 class folders
    packed-M/   M samples (a 32x32x3 uint8 array and an int32 label): `kfast.data.pack` shards (ArrayRecord) and
                the same samples as TFRecord files

then runs each loader in a fresh process and measures, per loader: time to the first batch (from building the
loader), steady samples/s over `--batches` batches, peak RSS of the main process and of the largest worker
process, the size of its resume state (`len(json.dumps(state))`, or the checkpoint's bytes for tf.data), and
the resume time (build a new loader, load the state, get the first batch mid-epoch), with a check that the
resumed batch is the one the first loader would have given next ("exact").

Loaders (batch 64, 2 workers where the loader has workers, a shuffled epoch):
    kfast-packed   FastLoader(PackedDataset(packed-M)), 2 processes; a permutation of all samples
    grain-ar       Grain DataLoader over ArrayRecordDataSource(kfast's shards), 2 processes; global shuffle
    tfdata-tfrec   tf.data over the TFRecords: shuffled files, interleave, 10k-sample shuffle buffer
    kfast-files    FastLoader(recipes.image_classification.ImageFolder(files-N)), 2 processes
    keras-files    keras.utils.image_dataset_from_directory(files-N)
MosaicML Streaming (MDS) is run when `streaming` imports; it is not installed here (see RESULTS.md).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/scale_bench.py --data /tmp/kfast-scale \\
        --files 100000 --packed 1000000 [--batches 200] [--plot out.png] [--only kfast-packed,grain-ar]

Grain is imported from `--pydeps` (default DATA/pydeps) when it is not installed, so that
`pip install --target DATA/pydeps --no-deps grain portpicker` gives it to this script alone.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 64
CLASSES = 10
# Side of the packed samples' square images: KFAST_SCALE_SIDE=16 makes 10^7 samples 8 GB instead of 30 GB.
SIDE = int(os.environ.get("KFAST_SCALE_SIDE", "32"))
TF_SHUFFLE_BUFFER = 10_000
TF_FILES = 16
CHUNK = 100_000
LOADERS = ("kfast-packed", "kfast-window", "grain-ar", "tfdata-tfrec", "streaming-mds", "kfast-files", "keras-files")

# ------------------------------------------------------------------------------------------------------
# Data: made once, reused.
# ------------------------------------------------------------------------------------------------------


def _samples(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples start..stop-1: the same values in every format and every run."""
    rng = np.random.default_rng([7, start])
    x = rng.integers(0, 256, size=(stop - start, SIDE, SIDE, 3), dtype=np.uint8)
    y = (np.arange(start, stop) % CLASSES).astype(np.int32)
    return x, y


def make_files(folder: str, n: int) -> float:
    """N JPEG files in 10 class folders; returns the seconds spent (0 when already made)."""
    done = os.path.join(folder, ".done")
    if os.path.exists(done):
        return 0.0
    from PIL import Image

    start = time.perf_counter()
    for c in range(CLASSES):
        os.makedirs(os.path.join(folder, f"class_{c}"), exist_ok=True)
    rng = np.random.default_rng(3)
    base = np.linspace(0, 255, SIDE, dtype=np.float32)
    for i in range(n):
        # A smooth gradient with noise: JPEG-like content of about 1 KB, quick to draw.
        image = (base[None, :, None] * (i % 7 + 1) / 7 + rng.integers(0, 48, (SIDE, SIDE, 3))).astype(np.uint8)
        Image.fromarray(image).save(os.path.join(folder, f"class_{i % CLASSES}", f"{i:08d}.jpg"), quality=90)
    open(done, "w").close()
    return time.perf_counter() - start


def make_packed(folder: str, m: int) -> float:
    """M samples packed by kfast; returns the seconds spent (0 when already made)."""
    if os.path.exists(os.path.join(folder, "kfast-pack.json")):
        return 0.0
    import kfast.data

    start = time.perf_counter()
    x, y = _samples(0, m) if m <= 4 * CHUNK else _chunked(m, folder + ".samples.npy")
    kfast.data.pack((x, y), folder, verbose=0)
    if m > 4 * CHUNK:
        del x
        os.unlink(folder + ".samples.npy")
    return time.perf_counter() - start


def _chunked(m: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The samples in a memory-mapped file: 10^7 samples are 30 GB, more than a small machine's memory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(m, SIDE, SIDE, 3))
    y = np.empty((m,), np.int32)
    for a in range(0, m, CHUNK):
        x[a:a + CHUNK], y[a:a + CHUNK] = _samples(a, min(m, a + CHUNK))
    return x, y


def make_tfrecords(folder: str, m: int) -> float:
    """The same M samples as TFRecord files of tf.train.Examples; returns the seconds spent."""
    done = os.path.join(folder, ".done")
    if os.path.exists(done):
        return 0.0
    import tensorflow as tf

    start = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    per_file = -(-m // TF_FILES)
    writers = [tf.io.TFRecordWriter(os.path.join(folder, f"part-{f:03d}.tfrecord")) for f in range(TF_FILES)]
    for a in range(0, m, CHUNK):
        x, y = _samples(a, min(m, a + CHUNK))
        for j in range(len(y)):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[j].tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[j])]))}))
            writers[(a + j) // per_file].write(example.SerializeToString())
    for w in writers:
        w.close()
    open(done, "w").close()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------------------
# Loaders. Each gives (build, state_of, resume): build() -> iterator; state_of(it) -> (state, bytes);
# resume(state) -> iterator at the saved position.
# ------------------------------------------------------------------------------------------------------


def _kfast(dataset_fn):
    from kfast.data import FastLoader

    held = {}

    def build():
        held["loader"] = FastLoader(dataset_fn(), training=True, workers=2, use_multiprocessing=True, seed=0)
        return iter(held["loader"])

    def state_of(it):
        state = held["loader"].state_dict()
        return state, len(json.dumps(state))

    def resume(state):
        held["old"] = held.pop("loader")
        held["old"].close()
        held["loader"] = FastLoader(dataset_fn(), training=True, workers=2, use_multiprocessing=True, seed=0)
        held["loader"].load_state_dict(state)
        return iter(held["loader"])

    return build, state_of, resume, lambda: held["loader"].close()


def _packed_dir(a) -> str:
    """The folder name of the packed data (its side in it, when not 32)."""
    return f"packed-{a.packed}" + ("" if SIDE == 32 else f"-{SIDE}px")


def kfast_packed(a):
    from kfast.data import PackedDataset

    return _kfast(lambda: PackedDataset(os.path.join(a.data, _packed_dir(a), "kfast"), BATCH, seed=0))


def kfast_window(a):
    # Whole shards in a random order, the samples of each 4 mixed: reads stay within 4 shards at a time.
    from kfast.data import PackedDataset

    return _kfast(lambda: PackedDataset(os.path.join(a.data, _packed_dir(a), "kfast"), BATCH, seed=0,
                                        shuffle_window=4))


def kfast_files(a):
    sys.path.insert(0, ROOT)
    from recipes.image_classification import ImageFolder

    return _kfast(lambda: ImageFolder(os.path.join(a.data, f"files-{a.files}"), BATCH, SIDE, seed=0))


if os.environ.get("KFAST_SCALE_GRAIN"):  # only in the Grain loader's processes (its workers unpickle this class)
    import grain
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags, which a plain script never parses
    _MapBase = grain.transforms.Map
else:
    _MapBase = object


class GrainDecode(_MapBase):
    """A kfast record (8-byte little-endian length, then bytes, per field) to (image, label)."""

    def map(self, record):
        (n,) = struct.unpack_from("<Q", record, 0)
        image = np.frombuffer(record, np.uint8, n, 8).reshape(SIDE, SIDE, 3)
        label = np.frombuffer(record, np.int32, 1, 16 + n)[0]
        return image, label


def grain_ar(a):
    import grain

    shards = sorted(glob.glob(os.path.join(a.data, _packed_dir(a), "kfast", "*.array_record")))

    def loader():
        source = grain.sources.ArrayRecordDataSource(shards)
        sampler = grain.samplers.IndexSampler(len(source), shuffle=True, seed=0, num_epochs=1,
                                              shard_options=grain.sharding.NoSharding())
        return grain.DataLoader(data_source=source, sampler=sampler, worker_count=2,
                                operations=[GrainDecode(), grain.transforms.Batch(BATCH, drop_remainder=True)])

    def state_of(it):
        state = it.get_state()
        return state, len(json.dumps(state.decode() if isinstance(state, bytes) else state))

    def resume(state):
        it = iter(loader())
        it.set_state(state)
        return it

    return lambda: iter(loader()), state_of, resume, lambda: None


def _tf_checkpointed(make, where):
    import tensorflow as tf

    def state_of(it):
        shutil.rmtree(where, ignore_errors=True)
        path = tf.train.Checkpoint(iterator=it).write(os.path.join(where, "ckpt"))
        size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(where, "*")))
        return path, size

    def resume(path):
        it = iter(make())
        tf.train.Checkpoint(iterator=it).read(path).expect_partial()
        return it

    return lambda: iter(make()), state_of, resume, lambda: None


def tfdata_tfrec(a):
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(a.data, _packed_dir(a), "tfrecord", "*.tfrecord")))
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(batch):
        parsed = tf.io.parse_example(batch, spec)
        image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (-1, SIDE, SIDE, 3))
        return image, tf.cast(parsed["label"], tf.int32)

    def make():
        ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0)
        ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=2, deterministic=True)
        ds = ds.shuffle(TF_SHUFFLE_BUFFER, seed=0).batch(BATCH, drop_remainder=True)
        return ds.map(parse, num_parallel_calls=2).prefetch(2)

    return _tf_checkpointed(make, os.path.join(a.data, "ckpt-tfdata"))


def keras_files(a):
    import keras

    def make():
        return keras.utils.image_dataset_from_directory(
            os.path.join(a.data, f"files-{a.files}"), image_size=(SIDE, SIDE), batch_size=BATCH, shuffle=True,
            seed=0, verbose=False).prefetch(2)

    return _tf_checkpointed(make, os.path.join(a.data, "ckpt-keras"))


def streaming_mds(a):
    import streaming  # noqa: F401 - not installed here; the row reads "not run"

    raise NotImplementedError("MosaicML Streaming is installed but this script has no MDS writer yet")


# ------------------------------------------------------------------------------------------------------
# Measuring one loader (in its own process).
# ------------------------------------------------------------------------------------------------------


class PeakRss:
    """Samples the RSS of this process and its descendants every 20 ms; keeps the peaks."""

    def __init__(self):
        import psutil

        self.me, self.main, self.worker, self._stop = psutil.Process(), 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            try:
                self.main = max(self.main, self.me.memory_info().rss)
                for child in self.me.children(recursive=True):
                    self.worker = max(self.worker, child.memory_info().rss)
            except Exception:  # noqa: BLE001 - a worker that exits while sampled
                pass

    def stop(self):
        self._stop.set()
        self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(self.main, own), self.worker


def _labels(batch):
    return np.asarray(batch[1]).tolist()


def measure(a) -> dict:
    build, state_of, resume, close = globals()[a.one.replace("-", "_")](a)
    rss = PeakRss()
    start = time.perf_counter()
    it = build()
    next(it)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(a.batches):
        next(it)
    steady = a.batches * BATCH / (time.perf_counter() - start)
    state, state_bytes = state_of(it)
    expected = _labels(next(it))
    del it
    start = time.perf_counter()
    again = resume(state)
    got = _labels(next(again))
    resumed = time.perf_counter() - start
    del again
    close()
    main, worker = rss.stop()
    return {"first_s": first, "samples_s": steady, "main_mb": main / 2**20, "worker_mb": worker / 2**20,
            "state_b": state_bytes, "resume_s": resumed, "exact": got == expected}


def run_one(a, name) -> dict:
    path = os.pathsep.join(p for p in (ROOT, a.pydeps, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, KFAST_SCALE_GRAIN="1" if name == "grain-ar" else "", PYTHONPATH=path)
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--data", a.data, "--files", str(a.files),
           "--packed", str(a.packed), "--batches", str(a.batches)]
    try:
        done = subprocess.run(["timeout", "-k", "10", str(a.timeout)] + cmd, env=env, capture_output=True,
                              text=True, cwd=ROOT)
    except OSError as e:
        return {"error": str(e)}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"rc {done.returncode}: {tail[:150]}"}


def table(results: dict) -> str:
    ref = results.get("kfast-packed", {})
    rows = [f"{'loader':<14} {'first s':>8} {'samples/s':>10} {'x kfast':>7} {'main MB':>8} {'worker MB':>9} "
            f"{'state B':>9} {'resume s':>8} {'exact':>5}"]
    for name, r in results.items():
        if "error" in r:
            rows.append(f"{name:<14} not run: {r['error']}")
            continue
        ratio = r["samples_s"] / ref["samples_s"] if "samples_s" in ref else float("nan")
        worker = f"{r['worker_mb']:.0f}" if r["worker_mb"] else "-"
        rows.append(f"{name:<14} {r['first_s']:>8.3f} {r['samples_s']:>10.0f} {ratio:>7.2f} {r['main_mb']:>8.0f} "
                    f"{worker:>9} {r['state_b']:>9} {r['resume_s']:>8.3f} {str(r['exact']):>5}")
    return "\n".join(rows)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: v for k, v in results.items() if "error" not in v}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, key, title in zip(axes, ("samples_s", "first_s", "resume_s"),
                              ("steady samples/s", "time to first batch (s)", "resume to first batch (s)")):
        ax.barh(list(ok), [v[key] for v in ok.values()])
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/tmp/kfast-scale")
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--packed", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--timeout", type=int, default=300, help="seconds per loader")
    p.add_argument("--only", default=",".join(LOADERS))
    p.add_argument("--pydeps", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.pydeps = a.pydeps or os.path.join(a.data, "pydeps")
    if a.one:
        print("RESULT " + json.dumps(measure(a)), flush=True)
        return
    # Only the data the chosen loaders read is made (10^7 samples take minutes per format).
    only = set(a.only.split(","))
    made = {}
    if only & {"kfast-files", "keras-files"}:
        made["files"] = make_files(os.path.join(a.data, f"files-{a.files}"), a.files)
    if only & {"kfast-packed", "kfast-window", "grain-ar"}:
        made["kfast pack"] = make_packed(os.path.join(a.data, _packed_dir(a), "kfast"), a.packed)
    if "tfdata-tfrec" in only:
        made["tfrecords"] = make_tfrecords(os.path.join(a.data, _packed_dir(a), "tfrecord"), a.packed)
    print("generation s (0 = reused): " + ", ".join(f"{k} {v:.1f}" for k, v in made.items()), flush=True)
    results = {}
    for name in a.only.split(","):
        results[name] = run_one(a, name)
        print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    print(f"files={a.files} packed={a.packed} batch={BATCH} batches={a.batches} "
          "(x kfast: samples/s over kfast-packed's)")
    print(table(results))
    if a.plot:
        plot(results, a.plot)


if __name__ == "__main__":
    main()
