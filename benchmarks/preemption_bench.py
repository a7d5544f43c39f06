"""What preemption support costs, and how fast a preempted job ends (issue 27).

1. Step-checkpoint overhead, end-to-end `fit` (README's scale-out model: a small conv net on 10x10 images,
   batches of 32 through a FastLoader), the step time side by side for:
   - "epoch saves only": RankZeroCheckpoint(preemption_signals=None), Keras's asynchronous batch hooks kept;
   - "preemption watch": the default, SIGTERM watched (a look at every step's end; an allreduce under Horovod);
   - "save_freq=100": the default plus a step checkpoint every 100 batches.
   Configurations alternate, one epoch each, for --rounds rounds; the median step time of each is reported
   with its ratio to the first. With --ranks 2 the same runs under horovodrun (every rank measures; rank 0
   prints).
2. SIGTERM to exit: tests/distributed/preempt_script.py is started, SIGTERM sent from outside once it trains
   (to its one process, or to both ranks as Slurm and Kubernetes signal every task), and the time to its exit
   measured: with the step checkpoint (status 75), and for a batch that never comes (status 143, after
   `preemption_timeout=3`).

    python benchmarks/preemption_bench.py [--rounds 5] [--ranks 1|2] [--skip-exit]
"""

import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "distributed", "preempt_script.py")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
CONFIGS = ("epoch saves only", "preemption watch", "save_freq=100")


def overhead(rounds):
    import keras
    import numpy as np

    import kfast
    import kfast.callbacks

    kfast.distributed.init()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(kfast.distributed.rank())
    x, y = rng.normal(size=(32 * 400, 10, 10, 1)).astype("float32"), rng.integers(0, 3, 32 * 400)
    model = keras.Sequential([keras.Input((10, 10, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                              keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(kfast.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 19:
                self.start = time.perf_counter()  # the first 20 steps warm up
            self.last, self.batch = time.perf_counter(), batch

        def step_s(self):
            return (self.last - self.start) / (self.batch - 19)

    times = {c: [] for c in CONFIGS}
    directory = tempfile.mkdtemp(prefix="kfast-preempt-bench-")
    data = kfast.data.ArrayDataset(x, y, batch_size=32, shuffle=True, seed=0)
    with kfast.data.FastLoader(data, training=True, workers=2, use_multiprocessing=False, seed=0) as loader:
        model.fit(loader, epochs=1, verbose=0)  # compile and warm the loader
        for _ in range(rounds):
            for config in CONFIGS:
                saver = kfast.callbacks.RankZeroCheckpoint(
                    os.path.join(directory, config.replace(" ", "-")), monitor="loss",
                    preemption_signals=None if config == "epoch saves only" else ("SIGTERM",),
                    save_freq=100 if config == "save_freq=100" else "epoch")
                clock = Clock()
                model.fit(loader, epochs=1, verbose=0, callbacks=[saver, clock])
                times[config].append(clock.step_s())
    if kfast.distributed.is_chief():
        base = statistics.median(times[CONFIGS[0]])
        print(f"step-checkpoint overhead, end-to-end fit, {kfast.distributed.size()} rank(s), "
              f"{len(loader)} steps/epoch per rank, {rounds} rounds:")
        for config in CONFIGS:
            median = statistics.median(times[config])
            print(f"  {config:18s} step {median * 1e3:7.3f} ms  ({median / base:.3f}x; rounds "
                  f"{', '.join(f'{t * 1e3:.2f}' for t in times[config])})")


def _trained(directory, ranks):
    try:
        return all(sum(1 for _ in open(os.path.join(directory, f"log-{r}.txt"))) >= 3 for r in range(ranks))
    except FileNotFoundError:
        return False


def _rank_pids(job):
    import psutil

    return [p for p in psutil.Process(job.pid).children(recursive=True)
            if any(part.endswith("preempt_script.py") for part in p.cmdline()) and p.name().startswith("python")]


def time_to_exit(ranks, stuck):
    directory = tempfile.mkdtemp(prefix="kfast-preempt-exit-")
    args = [SCRIPT, directory, "--seed", "7", "--processes", "--timeout", "3"]
    marker = os.path.join(directory, "stuck")
    if stuck:
        args += ["--stuck-at", "3", "--marker", marker]
    if ranks == 1:
        cmd = [sys.executable, *args]
    else:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        cmd = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", sys.executable, *args]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO,
                           start_new_session=True)
    deadline = time.monotonic() + 120
    while not (os.path.exists(marker) if stuck else _trained(directory, ranks)):
        if time.monotonic() > deadline or job.poll() is not None:
            os.killpg(job.pid, signal.SIGKILL)
            raise RuntimeError(f"the job did not start training: {job.communicate()[0][-2000:]}")
        time.sleep(0.05)
    time.sleep(2.0 if stuck else 0.3)  # stuck: every rank is blocked by now (the batch, or an allreduce)
    targets = [job.pid] if ranks == 1 else [p.pid for p in _rank_pids(job)]
    start = time.monotonic()
    for pid in targets:
        os.kill(pid, signal.SIGTERM)
    output = job.communicate(timeout=120)[0]
    took = time.monotonic() - start
    statuses = [int(s) for s in __import__("re").findall(r"exit with status code (\d+)", output)] or [job.returncode]
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "checkpoints", "*")))
    return took, statuses, files


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--skip-exit", action="store_true", help="only the overhead")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or args.ranks == 1:
        overhead(args.rounds)
    else:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        subprocess.run([horovodrun, "-np", str(args.ranks), "-H", f"localhost:{args.ranks}", "--gloo",
                        sys.executable, os.path.abspath(__file__), "--worker", "--rounds", str(args.rounds)],
                       check=True, env=ENV)
    if args.worker or args.skip_exit:
        return
    print("SIGTERM to exit (--processes loader, 2 workers per rank):")
    for ranks in (1, 2):
        for stuck in (False, True):
            took, statuses, files = time_to_exit(ranks, stuck)
            what = "stuck batch, preemption_timeout=3" if stuck else "at a step boundary"
            print(f"  {ranks} rank(s), {what:34s} {took:6.2f} s, exit status {statuses}, checkpoints {files}")


if __name__ == "__main__":
    main()
