"""`kfast launch`: build and run the command that starts a recipe or a script on N processes or several hosts
(the hosts of `-H`, of a host file, or of the Slurm allocation it runs in): horovodrun for Keras on TensorFlow,
kfast's own starter of JAX processes (`kfast.cluster.jax_processes`) for Keras on JAX."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def rank_command(recipe: str, recipe_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """What every rank runs: `python -m kfast.cli train RECIPE ARGS`, or `python SCRIPT ARGS` for a `.py` file."""
    if recipe.endswith(".py"):
        return [python, recipe, *recipe_args]
    return [python, "-m", "kfast.cli", "train", recipe, *recipe_args]


ENGINES = ("horovod", "jax")


def configured_backend() -> str:
    """Keras's backend as the ranks will see it, without importing Keras: `KERAS_BACKEND`, else the `backend`
    of Keras's config file (`$KERAS_HOME/keras.json`, or `~/.keras/keras.json`), else `"tensorflow"`."""
    import json
    import os

    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return str(json.load(f).get("backend", "tensorflow"))
    except (OSError, ValueError):
        return "tensorflow"


def engine_for(engine: str | None) -> str:
    """The engine `--engine` names, else the one of Keras's configured backend: `"jax"` on JAX, else `"horovod"`."""
    return engine or ("jax" if configured_backend() == "jax" else "horovod")


def jax_command(np: int, hosts: str | None, recipe: str, recipe_args: Sequence[str],
                python: str = sys.executable, directory: str | None = None) -> list[str]:
    """The command `kfast launch` runs on the JAX engine: kfast's starter of `np` JAX processes, on this host or
    on the hosts of `hosts` (`host:slots,...`; over ssh, each running in `directory`).

    Raises:
        ValueError: for a bad process count or host list, with the expected form.
    """
    from kfast.cluster import jax_hosts

    if np < 1:
        raise ValueError(f"-np must be at least 1, got {np}.")
    cmd = [python, "-m", "kfast.cluster.jax_processes", "-np", str(np)]
    if hosts is not None:
        jax_hosts.groups(np, hosts)  # its errors, before anything starts
        cmd += ["-H", hosts] + (["--chdir", directory] if directory else [])
    return cmd + ["--", *rank_command(recipe, recipe_args, python)]


def launch_command(np: int, hosts: str | None, hostfile: str | None, recipe: str, recipe_args: Sequence[str],
                   horovodrun: str = "horovodrun", python: str = sys.executable,
                   elastic: dict[str, Any] | None = None) -> list[str]:
    """The horovodrun command line `kfast launch` runs.

    `recipe` is a recipe's name, or a Python script (a name ending in `.py`) that every rank runs with
    `recipe_args`.

    `elastic`, for an elastic job: `{"min_np", "max_np", "discovery"}` (a host-discovery script, or None for the
    fixed -H hosts, at least two), and optionally `"interface"` (the network interface the ranks share); the
    recipe then runs with `--elastic`.

    Raises:
        ValueError: for a bad process count or host list, with the expected form.
    """
    from kfast.cluster.hosts import parse_host_list

    if np < 1:
        raise ValueError(f"-np must be at least 1, got {np}.")
    if hosts is not None:
        parse_host_list(hosts, np)  # its errors: an empty list (a job script's unset $HOSTS), a bad form, few slots
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
        if not recipe.endswith(".py"):
            recipe_args = [*recipe_args, "--elastic"]
        if elastic["discovery"]:
            if hosts or hostfile:
                raise ValueError("pass either --host-discovery-script or -H/--hostfile, not both.")
            return cmd + ["--host-discovery-script", elastic["discovery"], *rank_command(recipe, recipe_args, python)]
    if hosts:
        cmd += ["-H", hosts]
    elif hostfile:
        cmd += ["--hostfile", hostfile]
    else:
        cmd += ["-H", f"localhost:{np}"]
    return cmd + rank_command(recipe, recipe_args, python)


def add_launch(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "launch", help="run a recipe or a script on N processes / several hosts through horovodrun",
        description="Build and run the horovodrun command for a recipe or a Python script. The hosts come from "
                    "-H, a host file (`host slots=N` lines, as Kubernetes' MPI Operator writes), or, inside a "
                    "Slurm job, the allocation; else this machine. Hosts need kfast installed at the same "
                    "path and password-less SSH from this one; when other hosts take part, they are checked "
                    "first (see `kfast doctor --hosts`).")
    p.add_argument("-np", type=int, help="total number of processes (default: every slot of -H, the host file or "
                                         "the Slurm allocation; required on this machine alone)")
    p.add_argument("-H", dest="hosts", help="host:slots[,host:slots...] (default: the Slurm allocation, else "
                                            "localhost:NP)")
    p.add_argument("--hostfile", help="a host file instead of -H: `host slots=N` (or `host:N`) lines")
    p.add_argument("--chdir", metavar="DIR",
                   help="run every rank in DIR (default: this directory; it must exist on every host)")
    p.add_argument("--no-preflight", action="store_true",
                   help="start the job without first checking the other hosts")
    p.add_argument("--dry-run", action="store_true", help="print the command without running it")
    p.add_argument("--stop-signal", action="append", metavar="SIG",
                   help="a signal that stops the job with a checkpoint: the ranks on this host get SIGTERM, which "
                        "they watch (repeatable; default inside a Slurm job: SIGUSR1, for --signal=B:USR1@N)")
    p.add_argument("--no-requeue", action="store_true",
                   help="inside a Slurm job, do not requeue the job after a stop signal ended it resumably")
    p.add_argument("--print-sbatch", action="store_true",
                   help="print a Slurm batch script that runs this command, and exit (see --nodes and the others)")
    p.add_argument("--nodes", type=int, default=2, help="with --print-sbatch: nodes to ask for (default 2)")
    p.add_argument("--ntasks-per-node", type=int, default=1,
                   help="with --print-sbatch: ranks per node, one per GPU (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="with --print-sbatch: GPUs per node (default none)")
    p.add_argument("--time", default="24:00:00", help="with --print-sbatch: the job's time limit (default 24:00:00)")
    p.add_argument("--signal-lead", type=int, default=120, metavar="SECONDS",
                   help="with --print-sbatch: how long before the time limit Slurm sends USR1 (default 120)")
    p.add_argument("--engine", choices=ENGINES,
                   help="horovod (Keras on TensorFlow, through horovodrun) or jax (Keras's own distribution on JAX); "
                        "default: jax when Keras's backend is JAX (KERAS_BACKEND or keras.json), else horovod")
    p.add_argument("--elastic", action="store_true",
                   help="keep training as ranks leave and join, between --min-np and --max-np (Horovod's elastic "
                        "driver; the recipe runs with --elastic)")
    p.add_argument("--min-np", type=int, help="with --elastic: the fewest ranks to go on with (default -np)")
    p.add_argument("--max-np", type=int, help="with --elastic: the most ranks to grow to (default -np)")
    p.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="with --elastic: prints the available host:slots lines, polled every second")
    p.add_argument("recipe", metavar="RECIPE|SCRIPT.py", help="a name from `kfast recipes`, or a Python script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the recipe's (or the script's) options")
    p.set_defaults(run=run_launch)


def _preflight(names: Sequence[str], directory: str, engine: str = "horovod") -> bool:
    """Checks the hosts; prints what it found and returns True when the job may start."""
    from kfast.env import preflight

    checks = "hostnames, interfaces" if engine == "horovod" else "hostnames"
    print(f"kfast launch: checking {', '.join(names)} (ssh, working directory, versions, {checks}; --no-preflight "
          "skips this)", flush=True)
    result = preflight.check(names, directory=directory, engine=engine)
    for note in result["notes"]:
        print(f"kfast launch: {note}", flush=True)
    if not result["problems"]:
        return True
    for line in preflight.problem_lines(result):
        print(f"kfast launch: {line}", file=sys.stderr)
    started = "horovodrun was not started" if engine == "horovod" else "no JAX process was started"
    print(f"kfast launch: {len(result['problems'])} problem(s) found, so {started}; fix them, "
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


def _hosts(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """The -H list and the default -np: from -H, the host file, or the Slurm allocation (printed)."""
    from kfast import cluster

    if args.hosts is not None:  # -H "" is an error, not "no -H"
        if args.hostfile:
            raise ValueError("pass either -H or --hostfile, not both.")
        return args.hosts, cluster.parse_host_list(args.hosts).np
    if args.host_discovery_script and not args.hostfile:
        return None, None
    found = cluster.read_hostfile(args.hostfile) if args.hostfile else cluster.allocation()
    if found is None:
        return None, None
    print(f"kfast launch: {found.source}: {found.host_list} ({found.np} slot(s))", flush=True)
    return found.host_list, found.np


def _signal_numbers(names: list[str] | None) -> list[int]:
    from kfast.distributed import preemption

    return list(preemption.signal_numbers("kfast launch --stop-signal", list(names or ())))


def run_launch(args: argparse.Namespace) -> int:
    import os
    import shlex

    from kfast import cluster
    from kfast.env import preflight
    from kfast._core import tf_noise  # noqa: F401 - the launcher's output filter, loaded before TensorFlow
    from kfast.cluster import job
    from kfast.distributed import horovodrun_path

    try:
        if not args.recipe.endswith(".py"):
            from kfast import recipes  # imports Keras: a script's launch needs none of it here

            recipes.get(args.recipe)
        engine = engine_for(args.engine)
        if args.print_sbatch:
            print(cluster.batch_script(args.recipe, args.args, nodes=args.nodes,
                                       ntasks_per_node=args.ntasks_per_node, gpus_per_node=args.gpus_per_node,
                                       time=args.time, signal_lead=args.signal_lead, engine=engine), end="")
            return 0
        hosts, slots = _hosts(args)
        np = args.np if args.np is not None else slots
        if np is None:
            raise ValueError("-np is missing: give it, or hosts with -H, --hostfile or a Slurm allocation "
                             "(-np then defaults to their slots).")
        horovodrun = horovodrun_path()
        elastic: dict[str, Any] | None = None
        if args.elastic:
            elastic = {"min_np": args.min_np, "max_np": args.max_np, "discovery": args.host_discovery_script}
            if not (args.host_discovery_script or hosts):
                # Horovod's elastic driver wants two hosts or a discovery script: on this host alone, a script
                # that offers its slots (the ranks share only lo).
                elastic.update(discovery=_local_discovery(max(args.max_np or np, np)), interface="lo")
        elif args.min_np or args.max_np or args.host_discovery_script:
            raise ValueError("--min-np, --max-np and --host-discovery-script go with --elastic.")
        if engine == "jax":
            if args.elastic:
                raise ValueError("--elastic needs the Horovod engine (Keras on TensorFlow); JAX's processes are fixed "
                                 "for the whole job.")
            cmd = jax_command(np, hosts, args.recipe, args.args,
                              directory=os.path.abspath(args.chdir or os.getcwd()))
        else:
            cmd = launch_command(np, hosts, None, args.recipe, args.args, horovodrun=horovodrun, elastic=elastic)
        names = preflight.host_names(hosts)
        in_slurm = cluster.in_allocation()
        stop_signals = _signal_numbers(args.stop_signal or (["SIGUSR1"] if in_slurm else []))
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
    if engine == "horovod" and not os.path.exists(horovodrun):
        print("kfast launch: horovodrun was not found; install Horovod with `bash scripts/install_horovod.sh` "
              "(see README).", file=sys.stderr)
        return 2
    if not args.no_preflight and preflight.needed(names) and not _preflight(names, directory, engine):
        return 1
    requeue = os.environ.get("SLURM_JOB_ID") if in_slurm and not args.no_requeue else None
    # TensorFlow's start-up lines from every rank are dropped; warnings and errors pass.
    end = job.run(cmd, rank_command(args.recipe, args.args), cwd=directory, stop_signals=stop_signals,
                  requeue_job=requeue)
    return end.status
