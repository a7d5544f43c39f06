"""The diagnosis's arithmetic: a phase's typical step time and its range, and the verdict they allow.

NOTE [ Stretches, not single steps ]: single step times are a poor summary of a phase. Workers that load
in parallel deliver batches in bursts (two threads: a step that waited, then one that did not), so the
median step can be either kind; and one step stretched by a pause (another process taking the core, a new
epoch's iterator) pulls a mean. So each phase is cut into consecutive stretches of an even number of steps
(two up to twenty steps, more beyond, so that about five stretches or more are made; steps that do not
divide evenly are dropped from the start, nearest the warm-up), and each stretch's mean step time is taken:
bursts average out inside a stretch, and a pause moves one stretch only. The typical step time is the median
of the stretch means, and its range their interquartile range. When the verdict at the typical times
differs from the verdict somewhere in the ranges (each phase's low and high ends, in every combination),
the measurement could go either way, and the verdict says so: `UNCERTAIN`.

NOTE [ Input-bound means input wait ]: the verdict is read from the same accounting of a step that is
printed (`kfast._core.step_shares`): a step is input-bound when a quarter of it or more is not spent
computing and the input wait is at least as large a part of that as the other time (hand-off,
conversion, framework). A step that loses its time handing batches over is not input-bound however slow
the input alone is; a faster loader would not help it (issue 36: "INPUT-BOUND" beside "0% waiting").
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping

import numpy as np

from kfast._core.step_shares import StepShares

INPUT_BOUND = "input-bound"
COMPUTE_BOUND = "compute-bound"
BALANCED = "balanced"
UNCERTAIN = "uncertain"

# What a phase's times sum up to: (low, typical, high) seconds per step.
Range = tuple[float, float, float]


def stretch_seconds(times: Iterable[float]) -> Range:
    """`(low, typical, high)` seconds per step of one phase (see NOTE [ Stretches, not single steps ]).

    Example:

    >>> [round(t * 1e3) for t in stretch_seconds([0.02, 0.06] * 5)]  # bursts: a waiting step, then not
    [40, 40, 40]
    >>> [round(t * 1e3) for t in stretch_seconds([0.01] * 9 + [0.2])]  # one paused step moves the high end
    [10, 10, 10]
    >>> [round(t * 1e3) for t in stretch_seconds([0.01, 0.01, 0.01, 0.01, 0.02, 0.02])]  # slower at the end
    [10, 10, 15]
    """
    t = np.asarray(list(times), dtype=float)
    if not len(t):
        return float("nan"), float("nan"), float("nan")
    length = 2 * max(1, len(t) // 10)
    parts = len(t) // length
    means = [float(np.mean(part)) for part in np.split(t[len(t) - parts * length:], parts)] if parts else [float(t[0])]
    low, typical, high = np.percentile(means, [25, 50, 75])
    return float(low), float(typical), float(high)


def lost(t_comp: float, t_e2e: float) -> float:
    """Share of an end-to-end step not explained by compute alone."""
    return max(0.0, (t_e2e - t_comp) / t_e2e)


def shares(t_in: float, t_comp: float, t_e2e: float, overlapped: bool = True) -> StepShares:
    """The accounting of an end-to-end step of `t_e2e` seconds: compute is the model's own step (`t_comp`);
    the input costs the step what loading a batch takes beyond a compute step when training loads the
    next batch while the model computes (`overlapped`), else what loading one takes (`t_in`).

    Example:

    >>> shares(0.03, 0.01, 0.03).percents(), shares(0.011, 0.01, 0.03).percents()
    ({'compute': 33, 'input_wait': 67, 'other': 0}, {'compute': 34, 'input_wait': 3, 'other': 63})
    """
    return StepShares.split(t_e2e, compute=t_comp, input_wait=input_cost(t_in, t_comp, overlapped))


def input_cost(t_in: float, t_comp: float, overlapped: bool = True) -> float:
    """Seconds a step waits for its batch, as far as the input alone explains it: what loading a batch
    takes beyond a compute step when the next batch loads while the model computes, else all of it."""
    return max(0.0, t_in - t_comp) if overlapped else t_in


def verdict(t_in: float, t_comp: float, t_e2e: float, overlapped: bool = True) -> str:
    """The verdict for seconds per step of input alone, compute alone and end to end (see NOTE [ Input-bound
    means input wait ]).

    Example:

    >>> verdict(0.03, 0.01, 0.03), verdict(0.001, 0.01, 0.0105), verdict(0.01, 0.01, 0.0118)
    ('input-bound', 'compute-bound', 'balanced')
    >>> verdict(0.011, 0.01, 0.03)  # 67% not computing, but handing batches over, not waiting for them
    'balanced'
    """
    share = lost(t_comp, t_e2e)
    parts = shares(t_in, t_comp, t_e2e, overlapped)
    if share >= 0.25 and t_in > t_comp and parts.input_wait >= parts.other:
        return INPUT_BOUND
    if share < 0.10 or (2 * t_in <= t_comp and share < 0.25):
        # A little lost time beside an input twice as fast as the model is hand-over noise, not input.
        return COMPUTE_BOUND
    return BALANCED


def possible(ranges: Mapping[str, Range], overlapped: bool = True) -> tuple[list[str], tuple[float, float]]:
    """The verdicts the phases' ranges allow, the one at the typical times first, and the range of the
    lost share over the same combinations.

    Example:

    >>> possible({"input": (0.03, 0.03, 0.03), "compute": (0.01, 0.01, 0.01), "end_to_end": (0.03, 0.03, 0.03)})
    (['input-bound'], (0.6666666666666666, 0.6666666666666666))
    >>> possible({"input": (0.02, 0.02, 0.02), "compute": (0.0095, 0.01, 0.0105),
    ...           "end_to_end": (0.0105, 0.0115, 0.012)})[0]
    ['balanced', 'compute-bound']
    """
    (i_lo, i_typ, i_hi), (c_lo, c_typ, c_hi), (e_lo, e_typ, e_hi) = (ranges[k] for k in ("input", "compute",
                                                                                          "end_to_end"))
    corners = [(i_typ, c_typ, e_typ)] + [(i, c, e) for i in (i_lo, i_hi) for c in (c_lo, c_hi) for e in (e_lo, e_hi)]
    found: list[str] = []
    for corner in corners:
        if (v := verdict(*corner, overlapped)) not in found:
            found.append(v)
    shares = [lost(c, e) for _, c, e in corners]
    return found, (min(shares), max(shares))
