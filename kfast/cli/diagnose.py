"""`kfast diagnose`: the command line of `kfast.diagnose`."""

from __future__ import annotations

import argparse

from kfast.cli._common import load_target
from kfast.cli._common import show


def add_diagnose(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "diagnose", help="measure whether training is input-bound or compute-bound, and what to change",
        description="Run kfast.diagnose on the (model, data) returned by TARGET, a module:function taking no "
                    "arguments (the model compiled).")
    p.add_argument("target", metavar="TARGET", help="module:function or path/to/file.py:function")
    p.add_argument("--steps", type=int, default=50, help="timed batches per phase (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches first (default 5)")
    p.add_argument("--budget-s", type=float, default=20.0, help="seconds for the three phases (default 20)")
    p.add_argument("--plot", metavar="PNG", help="also write the diagnosis plot to this file")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.set_defaults(run=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    from kfast.diagnosis import diagnose

    model, data = load_target(args.target)()
    try:
        result = diagnose(model, data, steps=args.steps, warmup=args.warmup, budget_s=args.budget_s)
    finally:
        if hasattr(data, "close"):
            data.close()
    return show(result, args)
