"""One accounting of a training step: compute, input wait and other, wherever kfast prints or plots it.

NOTE [ One accounting of a step ]: a training step's wall time (from the end of one step to the end of the
next, as `fit` runs it) is split into three parts, in this order, and nothing else:

- compute: the model's own step (forward, backward, optimizer update), at most the whole step;
- input wait: the time the step waits for its batch beyond that, at most what compute leaves;
- other: the rest (handing the batch over: Keras's iterator, conversion to tensors, the copy to the device,
  Python and framework overhead).

They add up to the step, so their shares add up to 100%; printed shares are rounded so that the printed
percents add up to 100 too. `kfast.diagnose` knows all three: it times the model alone (compute), the
input alone, and real training steps; `Diagnosis.shares` holds them and its text, its picture and the
demo's table print that one object. `ThroughputMonitor` sees only an epoch's training time and a loader's
wait counter: it logs the input wait part alone (`input_wait_share`), under the same name,
`input_wait_fraction`. "Not spent computing" is input wait plus other, never input wait alone: the two
used to be printed side by side under names that read alike (issue 36).
"""

from __future__ import annotations

import dataclasses
import math

# The parts, in the order they are taken from a step, printed and stacked.
PARTS = ("compute", "input_wait", "other")

# What each part is called wherever it is printed or plotted.
LABELS = {"compute": "compute", "input_wait": "input wait", "other": "other (hand-off, conversion, framework)"}


def input_wait_share(waiting: float, seconds: float) -> float:
    """The input wait part of `seconds` of training in which the loop waited `waiting` seconds for batches,
    in [0, 1] (see NOTE [ One accounting of a step ]).

    Example:

    >>> input_wait_share(0.5, 2.0), input_wait_share(3.0, 2.0), input_wait_share(0.0, 0.0)
    (0.25, 1.0, 0.0)
    """
    if seconds <= 0:
        return 0.0
    return min(1.0, max(0.0, waiting / seconds))


@dataclasses.dataclass(frozen=True)
class StepShares:
    """A training step's seconds in its three parts: `compute`, `input_wait` and `other`.

    Build one with `split`, which takes the parts in order and caps each by what the step leaves, so they
    add up to the step (see NOTE [ One accounting of a step ]).

    Example:

    >>> s = StepShares.split(0.030, compute=0.010, input_wait=0.015)
    >>> s.percents()
    {'compute': 33, 'input_wait': 50, 'other': 17}
    >>> print(s)
    33% compute, 50% input wait, 17% other (hand-off, conversion, framework)
    """

    compute: float
    input_wait: float
    other: float

    @classmethod
    def split(cls, step: float, *, compute: float, input_wait: float) -> StepShares:
        """The accounting of a `step` of that many seconds: `compute` of it at most, then `input_wait` of
        what compute leaves at most, then the rest as other."""
        step = max(0.0, float(step))
        c = min(step, max(0.0, float(compute)))
        w = min(step - c, max(0.0, float(input_wait)))
        return cls(c, w, step - c - w)

    @staticmethod
    def labels() -> dict[str, str]:
        """What each part is called wherever it is printed or plotted, in order."""
        return dict(LABELS)

    @property
    def step(self) -> float:
        """Seconds of the whole step: the three parts together."""
        return self.compute + self.input_wait + self.other

    def fractions(self) -> dict[str, float]:
        """Each part's share of the step, in [0, 1]; together 1 (all 0 for a step of no time)."""
        step = self.step
        return {part: (getattr(self, part) / step if step > 0 else 0.0) for part in PARTS}

    def fraction(self, part: str) -> float:
        """One part's share of the step (`"compute"`, `"input_wait"` or `"other"`)."""
        return self.fractions()[part]

    @property
    def not_computing(self) -> float:
        """The share of the step not spent computing: input wait plus other."""
        f = self.fractions()
        return f["input_wait"] + f["other"] if self.step > 0 else 0.0

    def percents(self) -> dict[str, int]:
        """Whole percents that add up to 100 (largest remainders), as printed."""
        exact = {part: 100 * f for part, f in self.fractions().items()}
        if self.step <= 0:
            return {part: 0 for part in PARTS}
        out = {part: math.floor(v) for part, v in exact.items()}
        # Ties go to the part that comes first: the same input always prints the same way.
        for part in sorted(PARTS, key=lambda p: (out[p] - exact[p], PARTS.index(p)))[:100 - sum(out.values())]:
            out[part] += 1
        return out

    def __str__(self) -> str:
        pct = self.percents()
        return ", ".join(f"{pct[part]}% {LABELS[part]}" for part in PARTS)
