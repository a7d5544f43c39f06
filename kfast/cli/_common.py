"""What several `kfast` subcommands share; no subcommand module is imported back from here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def load_target(target: str) -> Callable[..., Any]:
    """Imports `module:function` (a module path or a .py file) and returns the function."""
    import importlib
    import importlib.util
    import os

    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise SystemExit(f"kfast: expected TARGET as module:function (e.g. mypkg.train:build), got {target!r}.")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0], module_name)
        if spec is None or spec.loader is None or not os.path.exists(module_name):
            raise SystemExit(f"kfast: no such file {module_name!r}.")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SystemExit(f"kfast: cannot import {module_name!r}: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise SystemExit(f"kfast: {module_name!r} has no function {func_name!r}.")
    return func


def show(result: Any, args: argparse.Namespace) -> int:
    """Prints a result (a Diagnosis or a Plan) as text or `--json`, and writes its `--plot`."""
    print(result.to_json() if args.json else result)
    if args.plot:
        result.plot(args.plot)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0
