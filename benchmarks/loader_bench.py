"""Input-pipeline benchmark: kfast FastLoader against Keras PyDataset and tf.data, in one run.

Every loader reads the same dataset objects, on three workloads:

    W1  64x224x224x3 uint8 batches made by one addition: measures the cost of moving bytes.
    W2  per-sample feature code in pure Python, which holds the GIL.
    W3  numpy sorting and FFTs, which release the GIL.

Loaders: Keras PyDataset with workers=1 (plain `ds[i]` in the main thread), with 2 threads and with 2
processes (both through Keras's own PyDatasetAdapter/OrderedEnqueuer, as `model.fit` drives them),
tf.data (`from_generator` and a parallel `numpy_function` map), and FastLoader with 2 processes and
with 2 threads. Steady throughput skips the first epoch and the first `--skip` batches of every later
epoch; start-up (time to the first batch) and the per-epoch restart are reported on their own.
The run ends with the copy bandwidth of a W1 batch, `model.fit` steps/s fed by three of the loaders,
and PASS/MISS against the project's targets.

Usage (about 3 minutes on 2 cores; --quick about one):
    python benchmarks/loader_bench.py [--batches N] [--epochs E] [--skip S] [--quick]

Other programs' CPU use is measured next to every number (column "other"); contaminated
measurements are repeated within a time budget (--quiet-budget).
"""

import os

# Set before TensorFlow is imported (here and in the spawned workers, which inherit the environment).
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import glob  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter  # noqa: E402

import kfast.data  # noqa: E402
from kfast.data import FastLoader  # noqa: E402
from kfast.data._workers import processes  # noqa: E402

BATCH = 64
IMAGE_SHAPE = (224, 224, 3)
NUM_CLASSES = 10
W2_FEATURES = 32
W3_LENGTH = 4096

# ------------------------------------------------------------------------------------------------------
# Datasets. They live at module level because FastLoader's spawned workers re-import this module to
# unpickle them.
# ------------------------------------------------------------------------------------------------------


class _Batches(keras.utils.PyDataset):
    """Shared base: `n` batches of (features, int32 labels)."""

    def __init__(self, n, **kwargs):
        super().__init__(**kwargs)
        self.n = n
        self.labels = np.arange(BATCH, dtype=np.int32) % NUM_CLASSES

    def __len__(self):
        return self.n

    def _check(self, index):
        # Keras's plain loop stops on IndexError; out-of-range indices must not wrap around.
        if not 0 <= index < self.n:
            raise IndexError(index)

    def _targets(self, index):
        return (self.labels + index) % NUM_CLASSES


class ImageBatches(_Batches):
    """W1: large uint8 image batches with almost no work (one vectorised add per batch)."""

    def __init__(self, n, **kwargs):
        super().__init__(n, **kwargs)
        # Random bytes, not np.zeros: fresh zero pages all map the same physical page and would make
        # every copy look far faster than real image data allows.
        self.base = np.random.default_rng(0).integers(0, 249, (BATCH,) + IMAGE_SHAPE, dtype=np.uint8)

    def __getitem__(self, index):
        self._check(index)
        return self.base + np.uint8(index % 7), self._targets(index)


def _python_features(seed):
    """Builds one sample's features with pure-Python float arithmetic (holds the GIL throughout)."""
    feats = [0.0] * W2_FEATURES
    x = float(seed % 997) + 1.0
    for _ in range(12):
        for j in range(W2_FEATURES):
            x = (x * 1.6180339 + j) % 1013.0
            feats[j] += x * 0.001 - feats[j] * 0.01
    return feats


class PythonFeatures(_Batches):
    """W2: per-sample pure-Python preprocessing, about 3 ms of GIL-holding work per batch."""

    def __getitem__(self, index):
        self._check(index)
        rows = [_python_features(index * BATCH + s) for s in range(BATCH)]
        return np.asarray(rows, dtype=np.float32), self._targets(index)


class NumpyWork(_Batches):
    """W3: numpy sorts and FFTs over 64x4096 floats (GIL released), about 5 ms per batch."""

    def __init__(self, n, **kwargs):
        super().__init__(n, **kwargs)
        self.signal = np.random.default_rng(1).standard_normal((BATCH, W3_LENGTH)).astype(np.float32)

    def __getitem__(self, index):
        self._check(index)
        a = self.signal + np.float32(index % 5)
        quantiles = np.sort(a, axis=1)[:, ::16]
        spectrum = np.abs(np.fft.rfft(a, axis=1))[:, :256].astype(np.float32)
        return np.concatenate([quantiles, spectrum], axis=1), self._targets(index)


WORKLOADS = {
    "W1": ("W1 images 64x224x224x3 u8", ImageBatches),
    "W2": ("W2 pure-Python per sample", PythonFeatures),
    "W3": ("W3 numpy, GIL released", NumpyWork),
}

# ------------------------------------------------------------------------------------------------------
# Loaders. Each builder returns `(one_epoch, close)`: `one_epoch()` yields one epoch of batches.
# ------------------------------------------------------------------------------------------------------


def keras_plain(ds, workers):
    """Keras with workers=1: `ds[i]` in the main thread, which is all PyDatasetAdapter does then."""
    del workers

    def one_epoch():
        for i in range(len(ds)):
            yield ds[i]

    return one_epoch, lambda: None


def _keras_enqueued(ds, workers, use_multiprocessing):
    """Keras's OrderedEnqueuer driven exactly as `model.fit` drives it, epoch by epoch."""
    ds.workers, ds.use_multiprocessing = workers, use_multiprocessing
    adapter = PyDatasetAdapter(ds, shuffle=False)

    def one_epoch():
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    def close():
        # The dataset objects are shared with the other loaders: give them back as found.
        ds.workers, ds.use_multiprocessing = 1, False

    return one_epoch, close


def keras_threads(ds, workers):
    """Keras PyDataset with `workers` threads."""
    return _keras_enqueued(ds, workers, use_multiprocessing=False)


def keras_processes(ds, workers):
    """Keras PyDataset with `workers` processes (multiprocessing.Pool, re-created every epoch)."""
    return _keras_enqueued(ds, workers, use_multiprocessing=True)


def _tf_signature(ds):
    import tensorflow as tf

    return tuple(tf.TensorSpec(np.shape(leaf), np.asarray(leaf).dtype) for leaf in ds[0])


def tf_generator_dataset(ds):
    """tf.data `from_generator` over the dataset, with AUTOTUNE prefetch (one producer thread)."""
    import tensorflow as tf

    def batches():
        for i in range(len(ds)):
            yield ds[i]

    data = tf.data.Dataset.from_generator(batches, output_signature=_tf_signature(ds))
    return data.prefetch(tf.data.AUTOTUNE)


def tf_generator(ds, workers):
    """Iterates `tf_generator_dataset(ds)`."""
    del workers
    return tf_generator_dataset(ds).as_numpy_iterator, lambda: None


def tf_parallel_map(ds, workers):
    """Iterates `tf_parallel_map_dataset(ds)`."""
    del workers
    return tf_parallel_map_dataset(ds).as_numpy_iterator, lambda: None


def tf_parallel_map_dataset(ds):
    """tf.data `range(n).map(numpy_function(ds[i]), num_parallel_calls=AUTOTUNE)`, prefetched."""
    import tensorflow as tf

    signature = _tf_signature(ds)

    def load(i):
        return ds[int(i)]

    def fetch(i):
        leaves = tf.numpy_function(load, [i], Tout=[s.dtype for s in signature])
        # numpy_function forgets shapes; restore them so the elements match the other loaders'.
        for leaf, spec in zip(leaves, signature):
            leaf.set_shape(spec.shape)
        return tuple(leaves)

    data = tf.data.Dataset.range(len(ds)).map(fetch, num_parallel_calls=tf.data.AUTOTUNE)
    return data.prefetch(tf.data.AUTOTUNE)


def fast_processes(ds, workers):
    """kfast FastLoader with `workers` spawned processes and the shared-memory ring."""
    loader = FastLoader(ds, workers=workers, use_multiprocessing=True)
    return lambda: iter(loader), loader.close


def fast_threads(ds, workers):
    """kfast FastLoader with `workers` threads."""
    loader = FastLoader(ds, workers=workers, use_multiprocessing=False)
    return lambda: iter(loader), loader.close


# Key, label, builder. The keys name the baselines the ratios and targets refer to.
LOADERS = [
    ("pd_w1", "PyDataset workers=1", keras_plain),
    ("pd_thr", "PyDataset 2 threads", keras_threads),
    ("pd_proc", "PyDataset 2 processes", keras_processes),
    ("tf_gen", "tf.data from_generator", tf_generator),
    ("tf_map", "tf.data parallel map", tf_parallel_map),
    ("fl_proc", "FastLoader 2 processes", fast_processes),
    ("fl_thr", "FastLoader 2 threads", fast_threads),
]
PYDATASET_KEYS = ("pd_w1", "pd_thr", "pd_proc")
FASTLOADER_KEYS = ("fl_proc", "fl_thr")

# ------------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------------

CONTAMINATED_CORES = 0.25  # other programs' load above which a measurement is retried


def _system_busy_s():
    """CPU-seconds all CPUs spent busy (or stolen by the hypervisor) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _process_table():
    """Maps every pid to `(parent pid, CPU-seconds of it and of its reaped children)`, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # After the parenthesised command name: state, ppid, ..., then utime, stime, cutime and
                # cstime at positions 11-14.
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        table[int(name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    return table


def _own_cpu_s():
    """CPU-seconds of this process and of all its descendants, live or exited.

    Loader workers are not always our children: Keras forks them, FastLoader may start them from a
    fork server (a child of ours), so the whole process tree is walked. An exited process's time moves
    to its parent's reaped-children total, so differences of this sum stay right.
    """
    table = _process_table()
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += table.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total


class CpuWatch:
    """Measures how many cores other programs kept busy while a measurement ran.

    On a shared 2-core machine a competing job silently halves a loader's speed; this makes the
    contamination visible next to each number instead of hiding it. Accuracy is about +-0.05 cores
    (10 ms clock ticks).
    """

    def __enter__(self):
        self._t, self._busy, self._own = time.perf_counter(), _system_busy_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self._t
        other = (_system_busy_s() - self._busy) - (_own_cpu_s() - self._own)
        self.other_cores = max(0.0, other / wall)


class QuietGate:
    """Runs measurements while other programs leave the CPUs alone, within a total time budget.

    A measurement taken while other programs used the CPUs is thrown away and taken again, up to
    `attempts` tries; the least contaminated one is kept and its `other_cores` is reported. Waiting for
    quiet CPUs and re-measuring both draw on `budget_s`; once it is spent, every measurement is taken
    once, so a machine that never gets quiet still finishes in bounded time (with the contamination
    shown in the tables).
    """

    def __init__(self, budget_s, attempts):
        self.budget_s = budget_s
        self.attempts = attempts
        self.waited_s = 0.0
        self.retries = 0

    def wait(self):
        """Waits until other programs use fewer than CONTAMINATED_CORES cores, or the budget is spent."""
        while self.budget_s > 0:
            start = time.perf_counter()
            with CpuWatch() as watch:
                time.sleep(0.5)
            spent = time.perf_counter() - start
            self.budget_s -= spent
            if watch.other_cores < CONTAMINATED_CORES:
                return
            self.waited_s += spent

    def measure(self, fn, what):
        """Returns `fn()` (a result with `other_cores`), taken when the CPUs were quiet if possible."""
        results = []
        for attempt in range(self.attempts):
            self.wait()
            start = time.perf_counter()
            results.append(fn())
            if results[-1].other_cores < CONTAMINATED_CORES:
                break
            self.budget_s -= time.perf_counter() - start  # a thrown-away run costs the budget too
            again = attempt + 1 < self.attempts and self.budget_s > 0
            self.retries += again
            print(f"  {what}: other programs used {results[-1].other_cores:.2f} cores; "
                  f"{'measuring again' if again else 'keeping the least contaminated run'}", flush=True)
            if not again:
                break
        return min(results, key=lambda r: r.other_cores)


@dataclasses.dataclass
class Result:
    """Throughput of one loader on one workload.

    Attributes:
        startup_s: from building the loader to its first batch (worker start-up included).
        restart_ms: mean time from the start of a measured epoch to its first batch.
        steady_bps: batches/s over measured epochs, each without its first `skip` batches.
        min_bps: slowest measured epoch's steady batches/s.
        max_bps: fastest measured epoch's steady batches/s.
        epoch_bps: batches/s over whole measured epochs, restarts included.
        other_cores: cores other programs kept busy meanwhile (see `CpuWatch`).
    """

    startup_s: float
    restart_ms: float
    steady_bps: float
    min_bps: float
    max_bps: float
    epoch_bps: float
    other_cores: float = 0.0


def _check_batch(batch, reference):
    # Catches a loader that silently yields something else (wrong leaf, dtype or shape).
    got = [(np.asarray(leaf).dtype, np.shape(leaf)) for leaf in batch]
    want = [(leaf.dtype, leaf.shape) for leaf in reference]
    if got != want:
        raise AssertionError(f"loader yielded {got}, expected {want}")


def _run_epochs(one_epoch, n, epochs, skip, reference):
    """Iterates 1 + `epochs` epochs; returns the first batch's time stamp and per-epoch timings."""
    first, restarts, steady, whole = None, [], [], []
    for epoch in range(epochs + 1):
        begin = time.perf_counter()
        stamps = []
        for batch in one_epoch():
            if not stamps:
                _check_batch(batch, reference)
            stamps.append(time.perf_counter())
        if len(stamps) != n:
            raise AssertionError(f"epoch had {len(stamps)} batches, expected {n}")
        if epoch == 0:
            first = stamps[0]
            continue
        restarts.append(stamps[0] - begin)
        steady.append(stamps[-1] - stamps[skip - 1])  # covers batches skip .. n-1
        whole.append(time.perf_counter() - begin)
    return first, restarts, steady, whole


def measure(build, ds, workers, epochs, skip):
    """Runs one warm-up epoch and `epochs` measured ones of the loader `build(ds, workers)` makes.

    Args:
        build: a loader builder from LOADERS.
        ds: the dataset.
        workers: workers for the parallel loaders.
        epochs: measured epochs after the warm-up one.
        skip: batches at the start of every measured epoch left out of the steady rate.

    Returns:
        A `Result`.
    """
    n = len(ds)
    reference = ds[0]
    with CpuWatch() as watch:
        t0 = time.perf_counter()
        one_epoch, close = build(ds, workers)
        try:
            first, restarts, steady, whole = _run_epochs(one_epoch, n, epochs, skip, reference)
        finally:
            close()
    per_epoch = [(n - skip) / t for t in steady]
    return Result(startup_s=first - t0, restart_ms=1e3 * statistics.mean(restarts),
                  steady_bps=(n - skip) * epochs / sum(steady), min_bps=min(per_epoch),
                  max_bps=max(per_epoch), epoch_bps=n * epochs / sum(whole),
                  other_cores=watch.other_cores)


def _median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(x, reps=50):
    """Memory-copy bandwidth of one W1 batch, in GB/s.

    Args:
        x: the batch's image array.
        reps: timed repetitions; the median is kept.

    Returns:
        Dict with `copyto` (into one preallocated array: the targets' reference), `copy` (`x.copy()`),
        and `copyto_cold` (rotating through buffers far larger than the CPU caches, i.e. DRAM speed).
    """
    dst = np.empty_like(x)
    np.copyto(dst, x)  # fault the destination's pages in before timing
    out = {"copyto": x.nbytes / _median_seconds(lambda: np.copyto(dst, x), reps) / 1e9,
           "copy": x.nbytes / _median_seconds(x.copy, reps) / 1e9}
    # ~12 x 9.6 MB sources and destinations: each copy misses the caches like a loader's ring slots do.
    pairs = [(x + np.uint8(k), np.empty_like(x)) for k in range(12)]
    for src, buf in pairs:
        np.copyto(buf, src)
    rotation = itertools.cycle(pairs)

    def rotate():
        src, buf = next(rotation)
        np.copyto(buf, src)

    out["copyto_cold"] = x.nbytes / _median_seconds(rotate, reps) / 1e9
    return out


# ------------------------------------------------------------------------------------------------------
# model.fit end to end
# ------------------------------------------------------------------------------------------------------


class EpochTimer(keras.callbacks.Callback):
    """Records each epoch's wall time (the data adapter's epoch start and end fall inside it)."""

    def __init__(self):
        super().__init__()
        self.times = []
        self._begin = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._begin)


def image_model():
    """Small model on W1: rescale, 8x8 average pool, dense classifier."""
    return keras.Sequential([
        keras.Input(IMAGE_SHAPE),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.AveragePooling2D(8),
        keras.layers.Flatten(),
        keras.layers.Dense(NUM_CLASSES),
    ])


def feature_model():
    """Small MLP on W2's features."""
    return keras.Sequential([
        keras.Input((W2_FEATURES,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ])


@dataclasses.dataclass
class FitResult:
    """`model.fit` speed of one model and loader.

    Attributes:
        steps_per_s: steps/s over all measured epochs (every epoch after the first).
        median_steps_per_s: steps/s of the median measured epoch: robust to a one-off stall.
        first_epoch_s: the first epoch's time (tracing and worker start-up included).
        epoch_s: each measured epoch's time.
        total_s: the whole `fit` call.
        other_cores: cores other programs kept busy meanwhile (see `CpuWatch`).
    """

    steps_per_s: float
    median_steps_per_s: float
    first_epoch_s: float
    epoch_s: list
    total_s: float
    other_cores: float


def fit_rate(make_model, data, epochs, steps=None):
    """Fits a fresh model for 1 + `epochs` epochs on `data` (`steps` per epoch when `data` has no length,
    e.g. a repeated Grain dataset); returns a `FitResult`."""
    keras.utils.set_random_seed(0)
    model = make_model()
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = EpochTimer()
    with CpuWatch() as watch:
        t0 = time.perf_counter()
        # shuffle=False for every loader: FastLoader keeps its own order, so a shuffled Keras run would
        # not be the same work.
        model.fit(data, epochs=epochs + 1, steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[timer])
        total = time.perf_counter() - t0
    measured = timer.times[1:]
    steps = steps or len(data)
    return FitResult(steps_per_s=steps * epochs / sum(measured),
                     median_steps_per_s=steps / statistics.median(measured),
                     first_epoch_s=timer.times[0], epoch_s=measured, total_s=total,
                     other_cores=watch.other_cores)


def fit_benchmarks(steps, epochs, workers, gate):
    """`model.fit` steps/s on W1 and W2, fed by PyDataset workers=1, PyDataset processes, FastLoader.

    Args:
        steps: steps per epoch.
        epochs: measured epochs after the first.
        workers: workers of the parallel loaders.
        gate: the run's `QuietGate`.

    Returns:
        List of `(workload_key, loader_label, FitResult)`.
    """
    rows = []
    for key, make_model in (("W1", image_model), ("W2", feature_model)):
        ds = WORKLOADS[key][1](steps)
        runs = [("PyDataset workers=1", functools.partial(fit_rate, make_model, ds, epochs)),
                (f"PyDataset {workers} processes", functools.partial(_fit_keras_processes, make_model, ds,
                                                                     epochs, workers)),
                (f"FastLoader {workers} processes", functools.partial(_fit_fastloader, make_model, ds,
                                                                      epochs, workers))]
        for name, run in runs:
            rows.append((key, name, gate.measure(run, f"fit {key} {name}")))
    return rows


def _fit_keras_processes(make_model, ds, epochs, workers):
    ds.workers, ds.use_multiprocessing = workers, True
    try:
        return fit_rate(make_model, ds, epochs)
    finally:
        ds.workers, ds.use_multiprocessing = 1, False  # the dataset is shared with the other rows


def _fit_fastloader(make_model, ds, epochs, workers):
    # A fresh loader per attempt, so a retry pays the same worker start-up as the first try.
    with FastLoader(ds, workers=workers) as loader:
        return fit_rate(make_model, loader, epochs)


# ------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------


def library_fingerprint():
    """Short hash of kfast.data's source files: which FastLoader a run measured, and whether it changed."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(os.path.dirname(kfast.data.__file__), "*.py"))):
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:12]


def batch_nbytes(ds):
    """Bytes of all leaves of one batch."""
    return sum(np.asarray(leaf).nbytes for leaf in ds[0])


def print_loader_table(results, w1_bytes):
    """Prints one aligned row per (workload, loader) with ratios to the two PyDataset baselines."""
    header = (f"{'workload':<27} {'loader':<24} {'start s':>7} {'restart ms':>10} {'batch/s':>8} "
              f"{'min':>7} {'max':>7} {'epoch b/s':>9} {'GB/s':>6} {'/PD-proc':>8} {'/PD-w1':>7} {'other':>5}")
    print(header)
    print("-" * len(header))
    for wkey, rows in results.items():
        label = WORKLOADS[wkey][0]
        base = {key: res.steady_bps for key, _, res in rows}
        for _, name, r in rows:
            gbs = f"{r.steady_bps * w1_bytes / 1e9:6.2f}" if wkey == "W1" else f"{'-':>6}"
            print(f"{label:<27} {name:<24} {r.startup_s:7.2f} {r.restart_ms:10.1f} {r.steady_bps:8.1f} "
                  f"{r.min_bps:7.1f} {r.max_bps:7.1f} {r.epoch_bps:9.1f} {gbs} "
                  f"{r.steady_bps / base['pd_proc']:7.2f}x {r.steady_bps / base['pd_w1']:6.2f}x "
                  f"{r.other_cores:5.2f}")
            label = ""  # the workload's name only on its first row


def check_targets(results, w1_bytes, bandwidth):
    """Prints PASS/MISS for each target; returns the number missed."""
    bps = {w: {k: r.steady_bps for k, _, r in rows} for w, rows in results.items()}
    names = {k: n for k, n, _ in LOADERS}
    lines = []

    def target(ok, text):
        lines.append(f"{'PASS' if ok else 'MISS'}  {text}")

    if "W1" in bps:
        w1 = bps["W1"]
        ratio = w1["fl_proc"] / w1["pd_proc"]
        target(ratio >= 10, f"W1 FastLoader processes >= 10x PyDataset processes: {ratio:.2f}x "
                            f"({w1['fl_proc']:.1f} vs {w1['pd_proc']:.1f} batch/s)")
        gbs = w1["fl_proc"] * w1_bytes / 1e9
        share = gbs / bandwidth["copyto"]
        target(share >= 0.40, f"W1 FastLoader processes >= 40% of np.copyto bandwidth: {100 * share:.1f}% "
                              f"({gbs:.2f} of {bandwidth['copyto']:.2f} GB/s; "
                              f"{100 * gbs / bandwidth['copyto_cold']:.1f}% of cache-cold copyto)")
    if "W2" in bps:
        w2 = bps["W2"]
        ratio = w2["fl_proc"] / w2["pd_w1"]
        target(ratio >= 1.7, f"W2 FastLoader processes >= 1.7x PyDataset workers=1: {ratio:.2f}x "
                             f"({w2['fl_proc']:.1f} vs {w2['pd_w1']:.1f} batch/s)")
    for wkey, rates in bps.items():
        best_pd = max(PYDATASET_KEYS, key=rates.get)
        best_fl = max(FASTLOADER_KEYS, key=rates.get)
        for fl, how in ((best_fl, "best mode"), ("fl_proc", "default")):
            ratio = rates[fl] / rates[best_pd]
            target(ratio >= 0.95, f"{wkey} FastLoader {how} ({names[fl]}) >= 0.95x best PyDataset "
                                  f"({names[best_pd]}): {ratio:.2f}x")
    print("\n".join(lines))
    return sum(line.startswith("MISS") for line in lines)


def print_fit_table(rows):
    """Prints model.fit steps/s with ratios to the PyDataset rows of the same workload."""
    header = (f"{'model.fit on':<14} {'fed by':<24} {'steps/s':>8} {'median':>7} {'1st epoch s':>11} "
              f"{'measured epochs s':<18} {'fit s':>6} {'/PD-proc':>8} {'/PD-w1':>7} {'other':>5}")
    print(header)
    print("-" * len(header))
    base = {}
    for wkey, _, r in rows:
        base.setdefault(wkey, []).append(r.steps_per_s)  # workers=1 first, processes second
    for wkey, name, r in rows:
        w1_rate, proc_rate = base[wkey][0], base[wkey][1]
        model = "W1 pool+dense" if wkey == "W1" else "W2 MLP"
        epochs = " ".join(f"{t:.2f}" for t in r.epoch_s)
        print(f"{model:<14} {name:<24} {r.steps_per_s:8.2f} {r.median_steps_per_s:7.2f} "
              f"{r.first_epoch_s:11.2f} {epochs:<18} {r.total_s:6.2f} {r.steps_per_s / proc_rate:7.2f}x "
              f"{r.steps_per_s / w1_rate:6.2f}x {r.other_cores:5.2f}")


def parse_args():
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=150, help="batches per epoch (default 150)")
    p.add_argument("--epochs", type=int, default=3, help="measured epochs after one warm-up epoch")
    # More than Keras's default max_queue_size (10): batches queued up while the consumer waited for the
    # epoch's first one would otherwise be counted as if produced at the steady rate.
    p.add_argument("--skip", type=int, default=12, help="batches left out at the start of each epoch")
    p.add_argument("--workers", type=int, default=2, help="workers of the parallel loaders (default 2)")
    p.add_argument("--fit-steps", type=int, default=50, help="steps per model.fit epoch (default 50)")
    p.add_argument("--fit-epochs", type=int, default=3, help="measured model.fit epochs after the first")
    p.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W2,W3")
    p.add_argument("--no-fit", action="store_true", help="skip the model.fit section")
    p.add_argument("--quiet-budget", type=float, default=240.0,
                   help="seconds, in all, to wait for other programs to leave the CPUs (default 240)")
    p.add_argument("--attempts", type=int, default=3,
                   help="tries per measurement while other programs load the CPUs (default 3)")
    p.add_argument("--quick", action="store_true", help="small smoke run (about a minute)")
    args = p.parse_args()
    if args.quick:
        args.batches, args.epochs, args.fit_steps, args.fit_epochs = 40, 1, 12, 1
    if not 1 <= args.skip < args.batches:
        p.error("--skip must be at least 1 and less than --batches")
    return args


def main():
    """Runs every section and prints the tables; exits 0 whatever the targets say."""
    args = parse_args()
    started = time.perf_counter()
    print(f"loader_bench: {args.batches} batches/epoch, 1 warm-up + {args.epochs} measured epochs, "
          f"first {args.skip} batches of each measured epoch skipped, {args.workers} workers; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    fingerprint = library_fingerprint()
    print(f"keras {keras.__version__}, numpy {np.__version__}, batch size {BATCH}; kfast.data sources "
          f"{fingerprint}, worker start method {processes.START_METHOD}\n")

    gate = QuietGate(args.quiet_budget, args.attempts)
    results = {}
    w1_bytes = batch_nbytes(ImageBatches(1))
    for wkey in args.workloads.split(","):
        ds = WORKLOADS[wkey][1](args.batches)
        results[wkey] = []
        for lkey, name, build in LOADERS:
            run = functools.partial(measure, build, ds, args.workers, args.epochs, args.skip)
            r = gate.measure(run, f"{wkey} {name}")
            results[wkey].append((lkey, name, r))
            print(f"  done {wkey} {name:<24} {r.steady_bps:8.1f} batch/s", flush=True)
    print("\nbatch/s: steady rate; min/max: slowest/fastest measured epoch; epoch b/s: whole epochs, "
          "restarts included;\nstart s: build to first batch; restart ms: epoch start to its first batch; "
          "other: cores used by other programs\n")
    print_loader_table(results, w1_bytes)

    gate.wait()
    bandwidth = copy_bandwidth(ImageBatches(1).base)
    print(f"\nW1 batch {w1_bytes} bytes; copy bandwidth: np.copyto {bandwidth['copyto']:.2f} GB/s, "
          f"a.copy() {bandwidth['copy']:.2f} GB/s, np.copyto cache-cold {bandwidth['copyto_cold']:.2f} GB/s")
    if "W1" in results:
        fl = {k: r for k, _, r in results["W1"]}["fl_proc"]
        gbs = fl.steady_bps * w1_bytes / 1e9
        print(f"W1 FastLoader processes {gbs:.2f} GB/s = {100 * gbs / bandwidth['copyto']:.1f}% of np.copyto, "
              f"{100 * gbs / bandwidth['copy']:.1f}% of a.copy(), "
              f"{100 * gbs / bandwidth['copyto_cold']:.1f}% of cache-cold np.copyto")

    if not args.no_fit:
        print(f"\nmodel.fit: {args.fit_steps} steps/epoch, 1 + {args.fit_epochs} epochs; steps/s over the "
              f"epochs after the first, median: the median one's rate")
        print_fit_table(fit_benchmarks(args.fit_steps, args.fit_epochs, args.workers, gate))

    print("\nTargets (steady batch/s):")
    missed = check_targets(results, w1_bytes, bandwidth)
    if library_fingerprint() != fingerprint:
        print(f"\nWARNING: kfast.data's sources changed during the run ({fingerprint} -> "
              f"{library_fingerprint()}); workers started after the change may run the new code.")
    print(f"\n{missed} target(s) missed; total run {time.perf_counter() - started:.0f} s, of which "
          f"{gate.waited_s:.0f} s waiting for other programs to leave the CPUs; {gate.retries} measurement(s) "
          f"repeated for contamination; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
