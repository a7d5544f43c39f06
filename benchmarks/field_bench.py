"""FastLoader against the loaders people reach for when Keras's PyDataset is too slow, and the machine's limit.

Loaders: the plain loop (PyDataset workers=1), Keras PyDataset with threads and with processes, tf.data
(`from_generator`, a parallel `numpy_function` map, and on W4 the native route: `tf.io.decode_jpeg`,
crop and flip in a parallel map), Grain (MapDataset read by threads, and `mp_prefetch` processes), and
kfast FastLoader (threads, processes, the setting `kfast.tune` picks, and in `fit` the one `kfast.tune(model=...)` picks). Workloads W1-W3 are
`loader_bench`'s (W1's dataset also has `fill_batch`, so FastLoader writes it straight into shared
memory; one row shows FastLoader without it), W4 decodes and augments real JPEGs (`jpeg_workload`).

Rounds are interleaved: every loader runs once per round (1 warm-up + `--epochs` measured epochs, a
fresh loader each time) in a rotated order, so a change in the machine's load falls on all loaders
alike. Rates are medians over rounds; "spread" is (fastest - slowest) / median over every measured
epoch of every round; "CPU ms/b" is the CPU time this process and its workers spent per batch, start-up
and warm-up included: unlike rates, it hardly moves when other programs load the machine. The machine limit of a workload is usable cores x the plain loop's rate. Then
`model.fit` steps/s on W1 and W4 for each loader, and PASS/MISS against issue 15's targets.

Usage (about 15 minutes on 2 cores; --quick a few):
    python benchmarks/field_bench.py [--rounds R] [--epochs E] [--workloads W1,W4] [--no-fit] [--quick]

The "other" column is the cores other programs used meanwhile (see `loader_bench.CpuWatch`).
"""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # before TensorFlow is imported, here and in workers

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import field_loaders as fl  # noqa: E402
import jpeg_workload  # noqa: E402
import loader_bench as lb  # noqa: E402
import no_loader  # noqa: E402
import kfast  # noqa: E402

PEERS = [
    ("plain", "plain loop (workers=1)", lb.keras_plain),
    ("pd_thr", "Keras PyDataset threads", lb.keras_threads),
    ("pd_proc", "Keras PyDataset processes", lb.keras_processes),
    ("tf_gen", "tf.data from_generator", lb.tf_generator),
    ("tf_map", "tf.data numpy_function map", lb.tf_parallel_map),
    ("tf_native", "tf.data native decode_jpeg", fl.tf_native),
    ("grain_thr", "Grain threads", fl.grain_threads),
    ("grain_proc", "Grain mp_prefetch processes", fl.grain_processes),
]
FIT_FEEDS = {"plain": fl.fit_plain, "pd_thr": fl.fit_keras_threads, "pd_proc": fl.fit_keras_processes,
             "tf_gen": fl.fit_tf_generator, "tf_map": fl.fit_tf_map, "tf_native": fl.fit_tf_native,
             "grain_thr": fl.fit_grain_threads, "grain_proc": fl.fit_grain_processes}
LIMIT_SHARE = 0.95
COPY_SHARE = 0.70
SPREAD_LIMIT = 0.15


def make_dataset(wkey, args, jpegs):
    """Workload `wkey`'s dataset with the batch count the arguments give it."""
    if wkey == "W4":
        return jpeg_workload.JpegBatches(args.jpeg_batches, jpegs)
    return {"W1": fl.FilledImages, "W2": lb.PythonFeatures, "W3": lb.NumpyWork}[wkey](args.batches)


def loaders_for(wkey, tuned):
    """`(key, label, builder)` of every loader raced on `wkey`; `tuned` is kfast.tune's result."""
    rows = [p for p in PEERS if p[0] != "tf_native" or wkey == "W4"]
    rows += [("kf_thr", "kfast threads", lb.fast_threads), ("kf_proc", "kfast processes", lb.fast_processes)]
    if wkey == "W1":
        rows.append(("kf_getitem", "kfast processes, __getitem__", fl.kfast_getitem))
    rows.append(("kf_tuned", f"kfast tuned {_setting(tuned.settings)}", fl.kfast_tuned(tuned.settings)))
    return rows


def _setting(s):
    return f"({'proc' if s['use_multiprocessing'] else 'thr'} w={s['workers']} q={s['max_queue_size']})"


def _rotated(items, r):
    r %= len(items)
    return items[r:] + items[:r]


def race(ds, rows, args, gate):
    """Runs every loader once per round, in a rotated order.

    Returns:
        `{key: [(lb.Result, CPU ms per batch) per round]}`; the CPU time is this process's and its
        descendants' (workers, fork servers) over the whole measurement, start-up included.
    """
    runs = {key: [] for key, _, _ in rows}
    batches = len(ds) * (1 + args.epochs)
    for r in range(args.rounds):
        gate.wait()
        for key, _, build in _rotated(rows, r):
            settle()
            cpu = lb._own_cpu_s()
            result = lb.measure(build, ds, args.workers, args.epochs, args.skip)
            runs[key].append((result, 1e3 * (lb._own_cpu_s() - cpu) / batches))
    return runs


def settle(idle_cores=0.1, most_s=10.0):
    """Waits until this process and its descendants are idle: a loader's processes may still be exiting
    (or starting, for Grain's spawned workers) after it closed, and would slow the next loader down."""
    deadline = time.perf_counter() + most_s
    while time.perf_counter() < deadline:
        cpu = lb._own_cpu_s()
        time.sleep(0.25)
        if (lb._own_cpu_s() - cpu) / 0.25 < idle_cores:
            return


def summary(runs):
    """Median rate over rounds, slowest and fastest epoch, their spread, start-up, restart, CPU and load."""
    results = [r for r, _ in runs]
    rate = statistics.median(r.steady_bps for r in results)
    low, high = min(r.min_bps for r in results), max(r.max_bps for r in results)
    return {"bps": rate, "min": low, "max": high, "spread": (high - low) / rate,
            "start": statistics.median(r.startup_s for r in results),
            "restart": statistics.median(r.restart_ms for r in results),
            "cpu": statistics.median(cpu for _, cpu in runs),
            "other": statistics.mean(r.other_cores for r in results)}


def print_table(wkey, rows, stats, cores):
    """One row per loader with ratios to the plain loop, the best peer and the machine limit."""
    best = max((k for k, _, _ in rows if not k.startswith("kf_")), key=lambda k: stats[k]["bps"])
    limit = cores * stats["plain"]["bps"]
    print(f"\n{wkey}: machine limit {cores} cores x plain {stats['plain']['bps']:.1f} = {limit:.1f} batch/s; "
          f"best peer: {dict((k, n) for k, n, _ in rows)[best]}")
    print(f"{'loader':<36} {'batch/s':>8} {'min':>7} {'max':>7} {'spread':>6} {'start s':>7} {'restart ms':>10} "
          f"{'CPU ms/b':>8} {'/plain':>7} {'/best peer':>10} {'/limit':>7} {'other':>5}")
    for key, name, _ in rows:
        s = stats[key]
        print(f"{name:<36} {s['bps']:8.1f} {s['min']:7.1f} {s['max']:7.1f} {100 * s['spread']:5.0f}% "
              f"{s['start']:7.2f} {s['restart']:10.1f} {s['cpu']:8.2f} {s['bps'] / stats['plain']['bps']:6.2f}x "
              f"{s['bps'] / stats[best]['bps']:9.2f}x {s['bps'] / limit:6.0%} {s['other']:5.2f}")
    return best, limit


def tune_for_fit(ds, args):
    """`kfast.tune(ds, model=...)` on the model `fit_race` trains: settings scored by training steps/s."""
    keras.utils.set_random_seed(0)
    model = lb.image_model()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return kfast.tune(ds, model=model, budget_s=2 * args.tune_budget, force=True)


def fit_race(wkey, ds, rows, tuned, fit_tuned, args, gate):
    """`model.fit` steps/s fed by each loader, interleaved over `--fit-rounds`; `{key: [FitResult]}`."""
    feeds = dict(FIT_FEEDS, kf_thr=fl.fit_kfast(use_multiprocessing=False),
                 kf_proc=fl.fit_kfast(use_multiprocessing=True), kf_tuned=fl.fit_kfast(**tuned.settings),
                 kf_fit_tuned=fl.fit_kfast(**fit_tuned.settings))
    keys = [k for k, _, _ in rows if k in feeds]
    runs = {k: [] for k in keys}
    for r in range(args.fit_rounds):
        gate.wait()
        for key in _rotated(keys, r):
            settle()
            data, steps, close = feeds[key](ds, args.workers)
            try:
                runs[key].append(lb.fit_rate(lb.image_model, data, args.fit_epochs, steps=steps))
            finally:
                close()
    return runs


def print_fit_table(wkey, rows, runs):
    """Median steps/s over fit rounds, with the ratio to fit fed by the plain PyDataset."""
    names = {k: n for k, n, _ in rows}
    base = statistics.median(r.steps_per_s for r in runs["plain"])
    print(f"\nmodel.fit on {wkey} (pool+dense classifier)")
    print(f"{'fed by':<36} {'steps/s':>8} {'rounds':<24} {'1st epoch s':>11} {'/plain':>7} {'other':>5}")
    rates = {}
    for key, results in runs.items():
        rates[key] = statistics.median(r.steps_per_s for r in results)
        each = " ".join(f"{r.steps_per_s:.1f}" for r in results)
        print(f"{names[key]:<36} {rates[key]:8.2f} {each:<24} {statistics.median(r.first_epoch_s for r in results):11.2f} "
              f"{rates[key] / base:6.2f}x {statistics.mean(r.other_cores for r in results):5.2f}")
    return rates


def check_targets(stats, limits, fits, bandwidth, w1_bytes):
    """Prints PASS/MISS per target of issue 15; returns how many were missed."""
    lines = []

    def target(ok, text):
        lines.append(f"{'PASS' if ok else 'MISS'}  {text}")

    if "W1" in stats:
        w1 = stats["W1"]
        gbs = w1["kf_proc"]["bps"] * w1_bytes / 1e9
        target(gbs >= COPY_SHARE * bandwidth["copyto"],
               f"W1 kfast processes (fill_batch) >= {COPY_SHARE:.0%} of cache-hot np.copyto: "
               f"{gbs / bandwidth['copyto']:.1%} ({gbs:.2f} of {bandwidth['copyto']:.2f} GB/s; "
               f"{gbs / bandwidth['copyto_cold']:.0%} of cache-cold)")
        spread = w1["kf_proc"]["spread"]
        target(spread < SPREAD_LIMIT, f"W1 kfast processes epoch-to-epoch spread < {SPREAD_LIMIT:.0%}: {spread:.1%} "
                                      f"({w1['kf_proc']['min']:.0f}-{w1['kf_proc']['max']:.0f} batch/s)")
    for wkey in ("W2", "W3", "W4"):
        if wkey not in stats:
            continue
        s, (best, limit) = stats[wkey], limits[wkey]
        tuned = s["kf_tuned"]["bps"]
        target(tuned >= s[best]["bps"], f"{wkey} kfast tuned >= best peer ({best}): {tuned / s[best]['bps']:.2f}x "
                                        f"({tuned:.1f} vs {s[best]['bps']:.1f} batch/s)")
        target(tuned >= LIMIT_SHARE * limit, f"{wkey} kfast tuned >= {LIMIT_SHARE:.0%} of the machine limit: "
                                             f"{tuned / limit:.1%} ({tuned:.1f} of {limit:.1f} batch/s)")
    for wkey, rates in fits.items():
        ratio = rates["kf_fit_tuned"] / rates["plain"]
        ok = ratio >= 1.0 if wkey == "W1" else ratio > 1.0
        target(ok, f"model.fit on {wkey} fed by kfast tuned with the model {'>=' if wkey == 'W1' else '>'} fed by "
                   f"the plain PyDataset: {ratio:.2f}x ({rates['kf_fit_tuned']:.1f} vs {rates['plain']:.1f} steps/s)")
    print("\n".join(lines))
    return sum(line.startswith("MISS") for line in lines)


def parse_args():
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--epochs", type=int, default=2, help="measured epochs per loader and round (default 2)")
    p.add_argument("--batches", type=int, default=150, help="batches per epoch on W1-W3 (default 150)")
    p.add_argument("--jpeg-batches", type=int, default=40, help="batches per epoch on W4 (default 40)")
    p.add_argument("--skip", type=int, default=8, help="batches left out at the start of each epoch (default 8)")
    p.add_argument("--workers", type=int, default=2, help="workers of the parallel loaders (default 2)")
    p.add_argument("--tune-budget", type=float, default=10.0, help="kfast.tune's budget_s (default 10)")
    p.add_argument("--workloads", default="W1,W2,W3,W4", help="comma-separated subset of W1,W2,W3,W4")
    p.add_argument("--fit-steps", type=int, default=40, help="steps per model.fit epoch on W1 (W4: half)")
    p.add_argument("--fit-epochs", type=int, default=3, help="measured model.fit epochs after the first")
    p.add_argument("--fit-rounds", type=int, default=4, help="interleaved model.fit rounds (default 4)")
    p.add_argument("--no-fit", action="store_true", help="skip the model.fit section")
    p.add_argument("--quiet-budget", type=float, default=120.0,
                   help="seconds, in all, to wait for other programs to leave the CPUs before rounds")
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.epochs, args.batches, args.jpeg_batches = 1, 1, 40, 12
        args.fit_steps, args.fit_epochs, args.fit_rounds, args.tune_budget = 12, 1, 1, 3
    if not 1 <= args.skip < min(args.batches, args.jpeg_batches):
        p.error("--skip must be at least 1 and less than --batches and --jpeg-batches")
    return args


def main():
    """Races every loader on every workload, then model.fit, and prints the tables and targets."""
    args = parse_args()
    # kfast.tune caches its choice per dataset; the benchmark measures afresh and leaves the user's cache alone.
    os.environ.setdefault("KFAST_CACHE_DIR", tempfile.mkdtemp(prefix="kfast_field_bench_"))
    import grain

    cores = len(os.sched_getaffinity(0))
    started = time.perf_counter()
    print(f"field_bench: {args.rounds} interleaved rounds x (1 warm-up + {args.epochs} epochs), {args.batches} "
          f"batches/epoch (W4: {args.jpeg_batches}), first {args.skip} of each epoch skipped, {args.workers} "
          f"workers; {cores} usable cores, load average {os.getloadavg()[0]:.2f}")
    print(f"keras {keras.__version__}, numpy {np.__version__}, grain {grain.__version__}; kfast.data sources "
          f"{lb.library_fingerprint()}")
    gate = lb.QuietGate(args.quiet_budget, attempts=1)
    jpegs = jpeg_workload.make_jpegs()
    stats, limits, fits = {}, {}, {}
    for wkey in args.workloads.split(","):
        ds = make_dataset(wkey, args, jpegs)
        gate.wait()
        t = time.perf_counter()
        tuned = kfast.tune(ds, budget_s=args.tune_budget, force=True)
        print(f"\n{wkey}: kfast.tune chose {_setting(tuned.settings)} in {time.perf_counter() - t:.1f} s:\n{tuned}")
        rows = loaders_for(wkey, tuned)
        stats[wkey] = {key: summary(res) for key, res in race(ds, rows, args, gate).items()}
        limits[wkey] = print_table(wkey, rows, stats[wkey], cores)
        if wkey in ("W1", "W4") and not args.no_fit:
            steps = args.fit_steps if wkey == "W1" else max(4, args.fit_steps // 2)
            fit_ds = make_dataset(wkey, argparse.Namespace(batches=steps, jpeg_batches=steps), jpegs)
            gate.wait()
            t = time.perf_counter()
            fit_tuned = tune_for_fit(fit_ds, args)
            print(f"\n{wkey}: kfast.tune(model=...) chose {_setting(fit_tuned.settings)} by training steps/s in "
                  f"{time.perf_counter() - t:.1f} s:\n{fit_tuned}")
            fit_rows = rows + [("kf_fit_tuned", f"kfast tuned with model {_setting(fit_tuned.settings)}", None)]
            fits[wkey] = print_fit_table(wkey, fit_rows, fit_race(wkey, fit_ds, fit_rows, tuned, fit_tuned, args, gate))

    gate.wait()
    w1_bytes = lb.batch_nbytes(lb.ImageBatches(1))
    bandwidth = lb.copy_bandwidth(lb.ImageBatches(1).base)
    print(f"\nW1 batch {w1_bytes} bytes; np.copyto {bandwidth['copyto']:.2f} GB/s cache-hot, "
          f"{bandwidth['copyto_cold']:.2f} GB/s cache-cold")
    print("\nWithout a loader (benchmarks/no_loader.py: the work alone, in 1 and in 2 processes at once):")
    for wkey in stats:
        if wkey == "W3":
            continue  # its plain loop pays page faults that worker processes do not: no common bound
        rate = (no_loader.fill_rate if wkey == "W1" else
                lambda n: no_loader.getitem_rate(make_dataset(wkey, args, jpegs), n))
        bound = {n: rate(n) for n in (1, 2)}
        best = max(bound.values())
        key = "kf_proc" if wkey == "W1" else "kf_tuned"
        print(f"{wkey}: 1 process {bound[1]:.1f} batch/s, 2 processes {bound[2]:.1f} batch/s; "
              f"{'kfast processes' if wkey == 'W1' else 'kfast tuned'} {stats[wkey][key]['bps']:.1f} batch/s = "
              f"{stats[wkey][key]['bps'] / best:.0%} of the better" +
              (f" ({best * w1_bytes / 1e9:.1f} GB/s written)" if wkey == "W1" else ""))
    print("\nTargets (issue 15):")
    missed = check_targets(stats, limits, fits, bandwidth, w1_bytes)
    print(f"\n{missed} target(s) missed; total {time.perf_counter() - started:.0f} s, {gate.waited_s:.0f} s of it "
          f"waiting for other programs; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
