"""`kfast tune`: the command line of `kfast.tune`."""

from __future__ import annotations

import argparse
from typing import Any

from kfast.cli._common import load_target


def add_tune(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "tune", help="find the fastest FastLoader workers / processes / queue depth for a dataset",
        description="Run kfast.tune on the dataset returned by TARGET, a module:function taking no arguments.")
    p.add_argument("target", metavar="TARGET", help="module:function or path/to/file.py:function")
    p.add_argument("--budget", type=float, default=30, help="seconds to spend (default 30)")
    p.add_argument("--max-workers", type=int, default=None, help="most workers to try (default 2x cores)")
    p.add_argument("--force", action="store_true", help="measure even if a cached result exists")
    p.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from kfast.tuning import tune

    dataset = load_target(args.target)()

    def progress(trial: dict[str, Any]) -> None:
        if "use_multiprocessing" not in trial:  # a tf.data pipeline's trial: its settings, by name
            shown = " ".join(f"{k}={v}" for k, v in trial.items() if k not in ("batches_per_s", "trial"))
            print(f"  tried {shown} {trial['batches_per_s']:8.1f} batches/s", flush=True)
            return
        mode = "processes" if trial["use_multiprocessing"] else "threads"
        print(f"  tried {mode:<9} workers={trial['workers']:<3} queue={trial['max_queue_size']:<3} "
              f"{trial['batches_per_s']:8.1f} batches/s", flush=True)

    try:
        count = f"{len(dataset)} batches"
    except TypeError:  # a tf.data pipeline of unknown cardinality
        count = "batches not counted"
    print(f"tuning {type(dataset).__name__} ({count}), budget {args.budget:g}s", flush=True)
    result = tune(dataset, budget_s=args.budget, max_workers=args.max_workers, force=args.force,
                        progress=progress)
    print(result)
    return 0
