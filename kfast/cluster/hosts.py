"""Host lists: `-H host1:4,host2:4`, horovodrun's form of hosts and their slots, read in one place for
`kfast launch` (either engine), the JAX processes' starter, the preflight and `kfast doctor --hosts`."""

from __future__ import annotations

import re

from kfast.cluster.slurm import Allocation

_HOST = r"[A-Za-z0-9_.\-]+"
_WITH_SLOTS = re.compile(rf"{_HOST}:\d+(,{_HOST}:\d+)*")
_SLOTS_OPTIONAL = re.compile(rf"{_HOST}(:\d+)?(,{_HOST}(:\d+)?)*")


def parse_host_list(hosts: str, np: int | None = None, *, option: str = "-H",
                    slots_optional: bool = False) -> Allocation:
    """The hosts and slots of a host list, in its order.

    Args:
        hosts: the list, `host:slots[,host:slots...]`.
        np: the processes to place: fewer slots than that is an error. Defaults to `None` (not checked).
        option: the option the list came with, named in the errors. Defaults to `"-H"`.
        slots_optional: whether a host may come without `:slots`, for one slot (`kfast doctor --hosts a,b`).
            Defaults to `False`.

    Returns:
        The hosts as an `Allocation` (`.hosts`, `.np`, `.host_list`), its source the option and the list.

    Raises:
        ValueError: for an empty list, a list of another form, or fewer slots than `np`.

    Example:

    >>> parse_host_list("host1:4,host2:2").hosts
    (('host1', 4), ('host2', 2))
    >>> parse_host_list("host1:1", np=2)
    Traceback (most recent call last):
    ...
    ValueError: -H host1:1 offers 1 slot(s) for -np 2; add hosts or slots.
    """
    form = "host[:slots][,host[:slots]...]" if slots_optional else "host:slots[,host:slots...]"
    if not hosts.strip():
        # An empty $HOSTS in a job script, say: training on localhost instead would hide it.
        raise ValueError(f"{option} {hosts!r} names no host; expected {form}, e.g. {option} host1:4,host2:4 "
                         f"(leave {option} out to run on this machine).")
    if not (_SLOTS_OPTIONAL if slots_optional else _WITH_SLOTS).fullmatch(hosts):
        raise ValueError(f"{option} {hosts!r} is not a host list; expected {form}, e.g. {option} host1:4,host2:4.")
    pairs = []
    for item in hosts.split(","):
        host, _, slots = item.partition(":")
        pairs.append((host, int(slots or 1)))
    found = Allocation(tuple(pairs), f"{option} {hosts}")
    if np is not None and found.np < np:
        raise ValueError(f"{option} {hosts} offers {found.np} slot(s) for -np {np}; add hosts or slots.")
    return found
