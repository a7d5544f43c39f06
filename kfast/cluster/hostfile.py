"""Host files: `host slots=N` lines (horovodrun's and Open MPI's form, what Kubernetes' MPI Operator writes
to /etc/mpi/hostfile) or `host:N` lines (the MPICH and Intel MPI form), `#` comments and blank lines."""

from __future__ import annotations

import re

from kfast.cluster.slurm import Allocation

_SLOTS_LINE = re.compile(r"(?P<host>[A-Za-z0-9_.\-]+)(?:\s+slots\s*=\s*(?P<slots>\d+)(?:\s+max_slots\s*=\s*\d+)?"
                         r"|:(?P<colon>\d+))?")


def read_hostfile(path: str) -> Allocation:
    """The hosts and slots of a host file; a host without a count gets one slot, as in Open MPI.

    Args:
        path: the file.

    Returns:
        The hosts, in the file's order (a host named twice adds its slots up).

    Raises:
        ValueError: for a file that cannot be read, names no host, or has a line of another form (with its
            number and text).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".hosts") as f:
        ...     _ = f.write("# written by the MPI Operator\\nworker-0.svc slots=4\\nworker-1.svc slots=4\\n")
        ...     f.flush()
        ...     read_hostfile(f.name).host_list
        'worker-0.svc:4,worker-1.svc:4'
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read the host file {path!r} ({e.strerror}); pass an existing file.") from e
    slots: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _SLOTS_LINE.fullmatch(text)
        if not match:
            raise ValueError(f"{path}, line {number}: {line.strip()!r} is not a host line; expected "
                             "`host slots=N` (or `host:N`, or a bare host for one slot).")
        count = int(match.group("slots") or match.group("colon") or 1)
        if count < 1:
            raise ValueError(f"{path}, line {number}: {line.strip()!r} offers no slot; give slots=1 or more.")
        slots[match.group("host")] = slots.get(match.group("host"), 0) + count
    if not slots:
        raise ValueError(f"the host file {path!r} names no host; expected `host slots=N` lines.")
    return Allocation(tuple(slots.items()), f"host file {path}")
