"""`kfast recipes` and `kfast train`: list the recipes and run one."""

from __future__ import annotations

import argparse
import sys


def add_recipes(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("recipes", help="list the ready-made training recipes",
                              description="List the recipes `kfast train` and `kfast launch` run.")
    p.set_defaults(run=run_recipes)


def run_recipes(args: argparse.Namespace) -> int:
    from kfast import recipes

    for name in recipes.names():
        print(f"  {name:<22} {recipes.get(name).SUMMARY}")
    print("\nRun one: kfast train NAME [--data PATH] [--epochs N] ...  (kfast train NAME --help for its options)")
    return 0


def add_train(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "train", help="run a recipe (alone, or under horovodrun)", add_help=False,
        description="Run a recipe; `kfast train RECIPE --help` lists its options.")
    p.add_argument("recipe", nargs="?", metavar="RECIPE", help="a name from `kfast recipes`")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's options")
    p.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from kfast import recipes

    if args.recipe in (None, "-h", "--help"):
        print("usage: kfast train RECIPE [options]; recipes: " + ", ".join(recipes.names()))
        return 0 if args.recipe else 2
    try:
        recipes.get(args.recipe)
    except ValueError as e:
        print(f"kfast train: {e}", file=sys.stderr)
        return 2
    recipes.run(args.recipe, args.args)
    return 0
