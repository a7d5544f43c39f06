"""`kfast launch`: build and run the horovodrun command for a recipe on N processes or several hosts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def launch_command(np: int, hosts: str | None, hostfile: str | None, recipe: str, recipe_args: Sequence[str],
                   horovodrun: str = "horovodrun", python: str = sys.executable,
                   elastic: dict[str, Any] | None = None) -> list[str]:
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
    if hosts is not None and not hosts.strip():
        # An empty $HOSTS in a job script, say: training on localhost instead would hide it.
        raise ValueError(f"-H {hosts!r} names no host; expected host:slots[,host:slots...], e.g. -H host1:4,host2:4 "
                         "(leave -H out to run on this machine).")
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


def add_launch(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.set_defaults(run=run_launch)


def _preflight(names: Sequence[str], directory: str) -> bool:
    """Checks the hosts; prints what it found and returns True when horovodrun may start."""
    from kfast.env import preflight

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


def _local_discovery(slots: int) -> str:
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


def run_launch(args: argparse.Namespace) -> int:
    import os
    import shlex

    from kfast.env import preflight
    from kfast import recipes
    from kfast._core import tf_noise
    from kfast.distributed import horovodrun_path

    try:
        recipes.get(args.recipe)
        horovodrun = horovodrun_path()
        elastic: dict[str, Any] | None = None
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
