"""The hosts and slots of the Slurm allocation this process runs in (`sbatch` or `salloc`).

Slots per node, in this order of precedence:
1. the tasks Slurm laid out (SLURM_TASKS_PER_NODE) when the job asked for tasks (`--ntasks`,
   `--ntasks-per-node`): one rank per task, the usual way to ask for one rank per GPU;
2. else the GPUs per node the job asked for (`--gpus-per-node=4`, SLURM_GPUS_PER_NODE): one rank per GPU;
3. else SLURM_TASKS_PER_NODE as Slurm set it (one per node by default).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from kfast.cluster.nodelist import expand_counts, expand_nodelist


@dataclass(frozen=True)
class Allocation:
    """Hosts with their slots, in order, and where they came from.

    Attributes:
        hosts: (host name, slots) pairs; the first is the host the job script runs on.
        source: what they were read from, for messages (e.g. "Slurm job 42").
    """

    hosts: tuple[tuple[str, int], ...]
    source: str

    @property
    def np(self) -> int:
        """Every slot: the default process count."""
        return sum(slots for _, slots in self.hosts)

    @property
    def host_list(self) -> str:
        """horovodrun's `-H` form, `host1:4,host2:4`."""
        return ",".join(f"{host}:{slots}" for host, slots in self.hosts)


def _gpus_per_node(value: str) -> int | None:
    # --gpus-per-node takes `4`, `gpu:4`, `a100:4` or `gpu:a100:4`; a list of types sums up.
    total = 0
    for item in value.split(","):
        match = re.fullmatch(r"(?:[A-Za-z0-9_\-]+:)*(\d+)", item.strip())
        if not match:
            return None
        total += int(match.group(1))
    return total or None


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a Slurm job (SLURM_JOB_ID and its node list are set)."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID") and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")))


def allocation(environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation's hosts and slots, from Slurm's environment; None outside Slurm.

    Args:
        environ: the environment to read (default: this process's).

    Returns:
        The hosts with their slots, or None when SLURM_JOB_ID or the node list is not set.

    Raises:
        ValueError: when Slurm's variables do not fit together, naming them and their values.

    Example:
        >>> env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02,07]", "SLURM_NTASKS": "5",
        ...        "SLURM_TASKS_PER_NODE": "2(x2),1"}
        >>> allocation(env).host_list
        'gpu01:2,gpu02:2,gpu07:1'
    """
    env = os.environ if environ is None else environ
    if not in_allocation(env):
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    hosts = expand_nodelist(nodelist)
    source = f"Slurm job {env['SLURM_JOB_ID']}"
    asked_tasks = bool(env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS"))
    gpus = _gpus_per_node(env.get("SLURM_GPUS_PER_NODE", "")) if env.get("SLURM_GPUS_PER_NODE") else None
    if env.get("SLURM_TASKS_PER_NODE") and (asked_tasks or gpus is None):
        name, counts = "SLURM_TASKS_PER_NODE", expand_counts(env["SLURM_TASKS_PER_NODE"])
    elif gpus is not None:
        name, counts = "SLURM_GPUS_PER_NODE", [gpus] * len(hosts)
    else:
        name, counts = "(no tasks or GPUs per node set)", [1] * len(hosts)
    if len(counts) != len(hosts):
        raise ValueError(f"{source}: {name}={env.get(name)!r} gives {len(counts)} node(s), but the node list "
                         f"{nodelist!r} has {len(hosts)}; pass -H host:slots,... to kfast launch instead.")
    if any(c < 1 for c in counts):
        raise ValueError(f"{source}: {name}={env.get(name)!r} gives a node no slot; pass -H instead.")
    return Allocation(tuple(zip(hosts, counts)), source)
