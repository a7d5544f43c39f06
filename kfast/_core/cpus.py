"""The one CPU count kfast uses, and the worker counts it tries."""

import os


def usable_cpus() -> int:
    """Returns the CPU cores this process may run on: its affinity mask (what taskset, cgroups' cpusets,
    Slurm and Docker's `--cpuset-cpus` leave it), not the machine's total.

    Example:

    >>> usable_cpus() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def doublings(most: int) -> list[int]:
    """Returns 1, 2, 4, ... up to `most`, and `most` itself last when it is not a power of two.

    Example:

    >>> doublings(6)
    [1, 2, 4, 6]
    >>> doublings(8)
    [1, 2, 4, 8]
    """
    counts = [1]
    while counts[-1] * 2 <= most:
        counts.append(counts[-1] * 2)
    if counts[-1] != most:
        counts.append(most)
    return counts
