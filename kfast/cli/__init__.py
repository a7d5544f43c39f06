"""The `kfast` command line. Each subcommand is one module with an `add(subparsers)` parser builder and a
runner; both stay thin and call the library. `python -m kfast.cli` runs it too (remote hosts do)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kfast.cli import diagnose
from kfast.cli import doctor
from kfast.cli import launch
from kfast.cli import pack
from kfast.cli import plan
from kfast.cli import recipes
from kfast.cli import tune
from kfast.cli.launch import launch_command

__all__ = ["build_parser", "launch_command", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfast", description="Fast input pipelines and Horovod scaling for Keras 3.")
    from kfast._version import __version__

    parser.add_argument("--version", action="version", version=f"kfast {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor.add_doctor(subparsers)
    diagnose.add_diagnose(subparsers)
    tune.add_tune(subparsers)
    pack.add_pack(subparsers)
    plan.add(subparsers)
    recipes.add_recipes(subparsers)
    recipes.add_train(subparsers)
    launch.add_launch(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)

