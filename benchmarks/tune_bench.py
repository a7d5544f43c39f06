"""kfast.tune vs an exhaustive grid over FastLoader settings, on the loader benchmark's workloads.

    python benchmarks/tune_bench.py             # W1, W2, W3
    python benchmarks/tune_bench.py --quick     # shorter bursts

For each workload: every (threads|processes) x workers x queue depth is measured with the same burst
the tuner uses; then kfast.tune runs from scratch (cache ignored). The tuner's choice is scored by the
grid's own measurement of that configuration, so both sides face the same noise.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loader_bench  # noqa: E402 - the shared workloads

import kfast  # noqa: E402
from kfast.tuning.search import measure_loader  # noqa: E402

WORKLOADS = {"W1 large uint8 batches": loader_bench.ImageBatches,
             "W2 pure-Python features": loader_bench.PythonFeatures,
             "W3 numpy (GIL released)": loader_bench.NumpyWork}


def grid(ds, max_workers, burst):
    rows = []
    start = time.perf_counter()
    for processes in (False, True):
        for workers in range(1, max_workers + 1):
            for queue in (2 * workers, 4 * workers):
                rate = measure_loader(ds, workers, processes, queue, seconds=burst)
                rows.append(((workers, processes, queue), rate))
    return dict(rows), time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=24, help="batches per workload dataset")
    parser.add_argument("--quick", action="store_true", help="0.5 s grid bursts instead of 1 s")
    parser.add_argument("--tuner-budget", type=float, default=5.0,
                        help="kfast.tune's budget_s (its bursts are a tenth of it; default 5)")
    args = parser.parse_args()
    burst = 0.5 if args.quick else 1.0
    max_workers = 2 * len(os.sched_getaffinity(0))
    print(f"grid: threads|processes x workers 1..{max_workers} x queue 2w|4w, {burst:g} s bursts; "
          f"tuner: kfast.tune(force=True, budget_s={args.tuner_budget:g})")
    header = (f"{'workload':<26} {'grid best':>22} {'b/s':>7} {'grid s':>7} {'tuner choice':>22} {'b/s':>7} "
              f"{'tune s':>7} {'of best':>8} {'time':>6}")
    print(header)
    verdicts = []
    for name, cls in WORKLOADS.items():
        ds = cls(args.batches)
        rates, grid_s = grid(ds, max_workers, burst)
        best_cfg = max(rates, key=rates.get)
        start = time.perf_counter()
        result = kfast.tune(ds, budget_s=args.tuner_budget, max_workers=max_workers, force=True)
        tune_s = time.perf_counter() - start
        chosen = (result.workers, result.use_multiprocessing, result.max_queue_size)
        chosen_rate = rates.get(chosen, result.batches_per_s)
        share, time_share = chosen_rate / rates[best_cfg], tune_s / grid_s
        verdicts.append(share >= 0.95 and time_share <= 0.25)

        def cfg(c):
            return f"{'proc' if c[1] else 'thr'} w={c[0]} q={c[2]}"

        print(f"{name:<26} {cfg(best_cfg):>22} {rates[best_cfg]:>7.1f} {grid_s:>7.1f} {cfg(chosen):>22} "
              f"{chosen_rate:>7.1f} {tune_s:>7.1f} {share:>8.0%} {time_share:>6.0%}", flush=True)
    print(f"\ntarget: within 5% of the grid's best in at most 25% of its time: "
          f"{sum(verdicts)}/{len(verdicts)} workloads PASS")


if __name__ == "__main__":
    main()
