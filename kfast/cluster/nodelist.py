"""Slurm's compressed host and count lists, expanded as Slurm expands them.

`gpu[01-04,07]` is gpu01, gpu02, gpu03, gpu04, gpu07 (a range keeps its first number's zero padding), and
`rack[1-2]-n[1-2]` is every combination, in Slurm's order. `2(x3),1` (SLURM_TASKS_PER_NODE,
SLURM_JOB_CPUS_PER_NODE) is 2, 2, 2, 1.
"""

from __future__ import annotations

import itertools
import re

_NAME_CHARS = re.compile(r"[A-Za-z0-9_.\-]*")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_MAX_HOSTS = 1_000_000  # a typo such as gpu[1-99999999] must fail, not fill the memory


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _numbers(ranges: str, whole: str) -> list[str]:
    out = []
    for item in ranges.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            raise ValueError(f"the node list {whole!r} has {item!r} inside brackets; expected numbers and ranges "
                             "such as [01-04,07].")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"the node list {whole!r} has the range {item!r}, which runs backwards; write "
                             f"[{high}-{low}].")
        if int(high) - int(low) >= _MAX_HOSTS:
            raise ValueError(f"the node list {whole!r} has the range {item!r}, over {_MAX_HOSTS} hosts.")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def expand_nodelist(nodelist: str) -> list[str]:
    """The host names of a Slurm node list, in order (what `scontrol show hostnames` prints).

    Args:
        nodelist: e.g. `$SLURM_JOB_NODELIST`, such as `gpu[01-04,07]` or `a1,b[2-3]`.

    Returns:
        The host names.

    Raises:
        ValueError: for a list Slurm would not write (unbalanced brackets, a bad range), quoting it.

    Example:
        >>> expand_nodelist("gpu[01-03,07],login")
        ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login']
    """
    if not nodelist.strip():
        raise ValueError("the node list is empty; expected Slurm's form, e.g. gpu[01-04,07].")
    hosts: list[str] = []
    for part in _split_top(nodelist.strip()):
        pieces = re.split(r"\[([^\[\]]*)\]", part)  # text, ranges, text, ranges, ..., text
        texts, groups = pieces[0::2], pieces[1::2]
        if not part or any(not _NAME_CHARS.fullmatch(t) for t in texts):
            raise ValueError(f"the node list {nodelist!r} has {part!r}, which is not a host name or a host "
                             "range; expected e.g. gpu[01-04,07] (brackets balanced, names of letters, digits, "
                             "'-', '_' and '.').")
        choices = [_numbers(g, nodelist) for g in groups]
        for combo in itertools.product(*choices):
            hosts.append("".join(t + n for t, n in zip(texts, [*combo, ""])))
            if len(hosts) > _MAX_HOSTS:
                raise ValueError(f"the node list {nodelist!r} names over {_MAX_HOSTS} hosts.")
    return hosts


def expand_counts(counts: str) -> list[int]:
    """The per-node numbers of a Slurm count list such as SLURM_TASKS_PER_NODE.

    Args:
        counts: e.g. `2(x3),1`.

    Returns:
        One number per node.

    Raises:
        ValueError: for another form, quoting it.

    Example:
        >>> expand_counts("2(x3),1")
        [2, 2, 2, 1]
    """
    out: list[int] = []
    for item in counts.strip().split(","):
        match = _COUNT.fullmatch(item.strip())
        if not match:
            raise ValueError(f"the count list {counts!r} has {item!r}; expected Slurm's form, e.g. 2(x3),1.")
        times = int(match.group(2) or 1)
        if times > _MAX_HOSTS:
            raise ValueError(f"the count list {counts!r} repeats {item!r} over {_MAX_HOSTS} times.")
        out += [int(match.group(1))] * times
    return out
