"""A Slurm batch script that runs `kfast launch` with the lines that matter for preemption and requeue."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence


def batch_script(target: str, args: Sequence[str] = (), *, nodes: int = 2, ntasks_per_node: int = 1,
                 gpus_per_node: int = 0, time: str = "24:00:00", signal_lead: int = 120,
                 python: str = sys.executable, engine: str = "horovod") -> str:
    """The text of an sbatch script that runs a recipe or a script on every task of its allocation.

    For a recipe, `--resume` is added (unless given): the first run starts fresh, a requeued run continues
    from the last checkpoint, inside its epoch.

    Args:
        target: a recipe's name, or a Python script (`.py`).
        args: the recipe's or the script's options.
        nodes: nodes to ask for.
        ntasks_per_node: ranks per node (one per GPU).
        gpus_per_node: GPUs per node to ask for (0: no GPU line).
        time: the time limit, in Slurm's form.
        signal_lead: seconds before the time limit that Slurm sends USR1 to the script.
        python: the interpreter with kfast installed.
        engine: `"horovod"` (Keras on TensorFlow) or `"jax"` (Keras's own distribution; the script then sets
            `KERAS_BACKEND=jax`).

    Returns:
        The script.

    Raises:
        ValueError: for counts below 1 or a negative lead.

    Example:
        >>> print(batch_script("tabular", ["--epochs", "3"], nodes=4).splitlines()[-1])  # doctest: +ELLIPSIS
        exec ... -m kfast.cli launch tabular --epochs 3 --resume
    """
    if engine not in ("horovod", "jax"):
        raise ValueError(f"--print-sbatch got the engine {engine!r}; expected horovod or jax.")
    if nodes < 1 or ntasks_per_node < 1 or gpus_per_node < 0 or signal_lead < 0:
        raise ValueError(f"--print-sbatch got --nodes {nodes}, --ntasks-per-node {ntasks_per_node}, --gpus-per-node "
                         f"{gpus_per_node}, --signal-lead {signal_lead}; expected nodes and tasks of 1 or more, "
                         "GPUs and the lead of 0 or more.")
    script = target.endswith(".py")
    args = list(args)
    if not script and "--resume" not in args:
        args.append("--resume")
    name = target[:-3].rsplit("/", 1)[-1] if script else target
    lines = [
        "#!/bin/bash",
        "# Written by `kfast launch --print-sbatch`; submit with `sbatch <this file>`.",
        f"#SBATCH --job-name=kfast-{name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={ntasks_per_node}  # one rank per task: kfast launch gives each node this many",
    ]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}  # each rank takes the GPU of its local rank")
    lines += [
        f"#SBATCH --time={time}",
        "#SBATCH --requeue  # the job may go back to the queue: after a preemption, or when kfast asks",
        f"#SBATCH --signal=B:USR1@{signal_lead}  # USR1 to this script {signal_lead} s before the time limit",
        "#SBATCH --open-mode=append  # a requeued run adds to the same log",
        "#SBATCH --output=%x-%j.out",
        "",
        "# kfast launch reads the nodes and tasks from Slurm and starts the ranks "
        + ("with horovodrun, over ssh" if engine == "horovod" else "(JAX processes) with kfast's starter, over ssh"),
        "# from this node to the others. `exec` makes it this script's process, so USR1 reaches it: every rank",
        "# then stops after the same step, rank 0 writes a checkpoint, and kfast launch requeues the job",
        "# (status 75: stopped, resumable)." + (" The requeued run resumes from that checkpoint (--resume)."
                                                if not script else
                                                " Your script resumes with kfast.distributed.restore()."),
        "# Keep checkpoints where the next run's first node can read them (a shared file system).",
        'cd "$SLURM_SUBMIT_DIR"',
        *(["export KERAS_BACKEND=jax  # the JAX engine: Keras's own distribution"] if engine == "jax" else []),
        "exec " + " ".join(shlex.quote(p) for p in [python, "-m", "kfast.cli", "launch", target, *args]),
    ]
    return "\n".join(lines) + "\n"
