"""The `kfast` command line. Each subcommand is one parser builder and one runner; both stay thin and
call the library."""

import argparse
import json
import sys

from kfast import plan_cli


def _add_doctor(subparsers):
    p = subparsers.add_parser(
        "doctor", help="report Python, TensorFlow, Keras, Horovod, NVML and GPUs, with fixes",
        description="Check this machine for kfast: versions, Horovod build, GPUs. Exits 1 if a required "
                    "piece is broken.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--hosts", metavar="HOST[,HOST...]",
                   help="also check these hosts for a multi-host launch, as `kfast launch` does before "
                        "starting horovodrun (ssh, working directory, versions, hostnames, interfaces)")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args):
    from kfast import doctor

    report = doctor.collect()
    if args.hosts:
        doctor.check_hosts(report, [h.rsplit(":", 1)[0] for h in args.hosts.split(",") if h])
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 1 if doctor.has_errors(report) else 0


def load_target(target):
    """Imports `module:function` (a module path or a .py file) and returns the function."""
    import importlib
    import importlib.util
    import os

    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise SystemExit(f"kfast: expected TARGET as module:function (e.g. mypkg.train:build), got {target!r}.")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0], module_name)
        if spec is None or not os.path.exists(module_name):
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


def _add_diagnose(subparsers):
    p = subparsers.add_parser(
        "diagnose", help="measure whether training is input-bound or compute-bound, and what to change",
        description="Run kfast.diagnose on the (model, data) returned by TARGET, a module:function taking no "
                    "arguments (the model compiled).")
    p.add_argument("target", metavar="TARGET", help="module:function or path/to/file.py:function")
    p.add_argument("--steps", type=int, default=50, help="timed batches per phase (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches first (default 5)")
    p.add_argument("--plot", metavar="PNG", help="also write the diagnosis plot to this file")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.set_defaults(run=_run_diagnose)


def _run_diagnose(args):
    import kfast

    model, data = load_target(args.target)()
    try:
        result = kfast.diagnose(model, data, steps=args.steps, warmup=args.warmup)
    finally:
        if hasattr(data, "close"):
            data.close()
    return show(result, args)


def show(result, args):
    """Prints a result (a Diagnosis or a Plan) as text or `--json`, and writes its `--plot`."""
    print(result.to_json() if args.json else result)
    if args.plot:
        result.plot(args.plot)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0


def _add_tune(subparsers):
    p = subparsers.add_parser(
        "tune", help="find the fastest FastLoader workers / processes / queue depth for a dataset",
        description="Run kfast.tune on the dataset returned by TARGET, a module:function taking no arguments.")
    p.add_argument("target", metavar="TARGET", help="module:function or path/to/file.py:function")
    p.add_argument("--budget", type=float, default=30, help="seconds to spend (default 30)")
    p.add_argument("--max-workers", type=int, default=None, help="most workers to try (default 2x cores)")
    p.add_argument("--force", action="store_true", help="measure even if a cached result exists")
    p.set_defaults(run=_run_tune)


def _run_tune(args):
    import kfast

    dataset = load_target(args.target)()

    def progress(trial):
        mode = "processes" if trial["use_multiprocessing"] else "threads"
        print(f"  tried {mode:<9} workers={trial['workers']:<3} queue={trial['max_queue_size']:<3} "
              f"{trial['batches_per_s']:8.1f} batches/s", flush=True)

    print(f"tuning {type(dataset).__name__} ({len(dataset)} batches), budget {args.budget:g}s", flush=True)
    result = kfast.tune(dataset, budget_s=args.budget, max_workers=args.max_workers, force=args.force,
                        progress=progress)
    print(result)
    return 0


def _add_recipes(subparsers):
    p = subparsers.add_parser("recipes", help="list the ready-made training recipes",
                              description="List the recipes `kfast train` and `kfast launch` run.")
    p.set_defaults(run=_run_recipes)


def _run_recipes(args):
    from kfast import recipes

    for name in recipes.names():
        print(f"  {name:<22} {recipes.get(name).SUMMARY}")
    print("\nRun one: kfast train NAME [--data PATH] [--epochs N] ...  (kfast train NAME --help for its options)")
    return 0


def _add_train(subparsers):
    p = subparsers.add_parser(
        "train", help="run a recipe (alone, or under horovodrun)", add_help=False,
        description="Run a recipe; `kfast train RECIPE --help` lists its options.")
    p.add_argument("recipe", nargs="?", metavar="RECIPE", help="a name from `kfast recipes`")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's options")
    p.set_defaults(run=_run_train)


def _run_train(args):
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


def launch_command(np, hosts, hostfile, recipe, recipe_args, horovodrun="horovodrun", python=sys.executable,
                   elastic=None):
    """The horovodrun command line `kfast launch` runs.

    `elastic`, for an elastic job: `{"min_np", "max_np", "discovery"}` (a host-discovery script, or None for the
    fixed -H hosts, at least two), and optionally `"interface"` (the network interface the ranks share); the
    recipe then runs with `--elastic`.

    Raises:
        ValueError: for a bad process count or host list, with the expected form.
    """
    import re

    if np < 1:
        raise ValueError(f"-np must be at least 1, got {np}.")
    if hosts and hostfile:
        raise ValueError("pass either -H or --hostfile, not both.")
    cmd = [horovodrun, "-np", str(np)]
    if elastic:
        low, high = elastic["min_np"] or np, elastic["max_np"] or np
        if not 1 <= low <= np <= high:
            raise ValueError(f"an elastic job needs 1 <= --min-np <= -np <= --max-np; got --min-np {low}, -np {np}, "
                             f"--max-np {high}.")
        cmd += ["--min-np", str(low), "--max-np", str(high)]
        if elastic.get("interface"):
            cmd += ["--network-interface", elastic["interface"]]
        recipe_args = [*recipe_args, "--elastic"]
        if elastic["discovery"]:
            if hosts or hostfile:
                raise ValueError("pass either --host-discovery-script or -H/--hostfile, not both.")
            return cmd + ["--host-discovery-script", elastic["discovery"], python, "-m", "kfast.cli", "train", recipe,
                          *recipe_args]
    if hosts:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+:\d+(,[A-Za-z0-9_.\-]+:\d+)*", hosts):
            raise ValueError(f"-H {hosts!r} is not a host list; expected host:slots[,host:slots...], "
                             "e.g. -H host1:4,host2:4.")
        slots = sum(int(h.rsplit(":", 1)[1]) for h in hosts.split(","))
        if slots < np:
            raise ValueError(f"-H {hosts} offers {slots} slot(s) for -np {np}; add hosts or slots.")
        cmd += ["-H", hosts]
    elif hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["-H", f"localhost:{np}"]
    return cmd + [python, "-m", "kfast.cli", "train", recipe, *recipe_args]


def _add_launch(subparsers):
    p = subparsers.add_parser(
        "launch", help="run a recipe on N processes / several hosts through horovodrun",
        description="Build and run the horovodrun command for a recipe. Hosts need kfast installed at the same "
                    "path and password-less SSH from this one; when other hosts take part, they are checked "
                    "first (see `kfast doctor --hosts`).")
    p.add_argument("-np", type=int, required=True, help="total number of processes")
    p.add_argument("-H", dest="hosts", help="host:slots[,host:slots...] (default: localhost:NP)")
    p.add_argument("--hostfile", help="a horovodrun host file instead of -H")
    p.add_argument("--chdir", metavar="DIR",
                   help="run every rank in DIR (default: this directory; it must exist on every host)")
    p.add_argument("--no-preflight", action="store_true",
                   help="start horovodrun without first checking the other hosts")
    p.add_argument("--dry-run", action="store_true", help="print the command without running it")
    p.add_argument("--elastic", action="store_true",
                   help="keep training as ranks leave and join, between --min-np and --max-np (Horovod's elastic "
                        "driver; the recipe runs with --elastic)")
    p.add_argument("--min-np", type=int, help="with --elastic: the fewest ranks to go on with (default -np)")
    p.add_argument("--max-np", type=int, help="with --elastic: the most ranks to grow to (default -np)")
    p.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="with --elastic: prints the available host:slots lines, polled every second")
    p.add_argument("recipe", metavar="RECIPE", help="a name from `kfast recipes`")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's options")
    p.set_defaults(run=_run_launch)


def _preflight(names, directory):
    """Checks the hosts; prints what it found and returns True when horovodrun may start."""
    from kfast import preflight

    print(f"kfast launch: checking {', '.join(names)} (ssh, working directory, versions, hostnames, "
          "interfaces; --no-preflight skips this)", flush=True)
    result = preflight.check(names, directory=directory)
    for note in result["notes"]:
        print(f"kfast launch: {note}", flush=True)
    if not result["problems"]:
        return True
    for line in preflight.problem_lines(result):
        print(f"kfast launch: {line}", file=sys.stderr)
    print(f"kfast launch: {len(result['problems'])} problem(s) found, so horovodrun was not started; fix them, "
          "or pass --no-preflight to start anyway.", file=sys.stderr)
    return False


def _local_discovery(slots):
    """A host-discovery script offering `slots` on localhost, removed when this process exits."""
    import atexit
    import os
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="kfast-launch-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = os.path.join(directory, "discover-localhost.sh")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho localhost:{slots}\n")
    os.chmod(path, 0o755)
    return path


def _run_launch(args):
    import os
    import shlex

    from kfast import preflight
    from kfast import recipes
    from kfast import tf_noise
    from kfast.distributed import horovodrun_path

    try:
        recipes.get(args.recipe)
        horovodrun = horovodrun_path()
        elastic = None
        if args.elastic:
            elastic = {"min_np": args.min_np, "max_np": args.max_np, "discovery": args.host_discovery_script}
            if not (args.host_discovery_script or args.hosts or args.hostfile):
                # Horovod's elastic driver wants two hosts or a discovery script: on this host alone, a script
                # that offers its slots (the ranks share only lo).
                elastic.update(discovery=_local_discovery(max(args.max_np or args.np, args.np)), interface="lo")
        elif args.min_np or args.max_np or args.host_discovery_script:
            raise ValueError("--min-np, --max-np and --host-discovery-script go with --elastic.")
        cmd = launch_command(args.np, args.hosts, args.hostfile, args.recipe, args.args, horovodrun=horovodrun,
                             elastic=elastic)
        names = preflight.host_names(args.hosts, args.hostfile)
    except ValueError as e:
        print(f"kfast launch: {e}", file=sys.stderr)
        return 2
    directory = os.path.abspath(args.chdir or os.getcwd())
    if not os.path.isdir(directory):
        print(f"kfast launch: --chdir {args.chdir!r} is not a directory on this host; pass a directory that "
              "exists on every host.", file=sys.stderr)
        return 2
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    if args.dry_run:
        return 0
    if not os.path.exists(horovodrun):
        print("kfast launch: horovodrun was not found; install Horovod with `bash scripts/install_horovod.sh` "
              "(see README).", file=sys.stderr)
        return 2
    if not args.no_preflight and preflight.needed(names) and not _preflight(names, directory):
        return 1
    # TensorFlow's start-up lines from every rank are dropped; warnings and errors pass.
    return tf_noise.run(cmd, cwd=directory)


def build_parser():
    parser = argparse.ArgumentParser(prog="kfast", description="Fast input pipelines and Horovod scaling for Keras 3.")
    from kfast import __version__

    parser.add_argument("--version", action="version", version=f"kfast {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_doctor(subparsers)
    _add_diagnose(subparsers)
    _add_tune(subparsers)
    plan_cli.add(subparsers)
    _add_recipes(subparsers)
    _add_train(subparsers)
    _add_launch(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
