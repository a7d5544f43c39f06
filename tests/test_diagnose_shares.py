"""One accounting of a training step (kfast/_core/step_shares.py): compute, input wait and other, with the
same names and numbers in `diagnose`'s text, its picture, `to_dict()` and its verdict (issue 36: "INPUT-BOUND
(64% of step time not spent computing)" beside "waiting for input 0%" for the same loader)."""

import re

import numpy as np
import pytest

from kfast._core.step_shares import LABELS
from kfast._core.step_shares import PARTS
from kfast._core.step_shares import StepShares
from kfast.diagnosis import Diagnosis
from kfast.diagnosis import plot

# The tuned loader: the input alone a hair slower than the model, the step nearly three times the model.
HAND_OFF = {"input": [0.0038] * 12, "compute": [0.0037] * 12, "end_to_end": [0.0103] * 12}
# A loader that is the limit: the step waits for its batch.
STARVED = {"input": [0.0073] * 12, "compute": [0.0037] * 12, "end_to_end": [0.0081] * 12}


def _shares_in(text):
    """{part: percent} from a "40% compute, 39% input wait, 21% other (...)" line."""
    found = {}
    for part in PARTS:
        m = re.search(rf"(\d+)% {re.escape(LABELS[part])}", text)
        assert m, (part, text)
        found[part] = int(m.group(1))
    return found


def test_split_takes_compute_then_input_wait_then_the_rest_and_adds_up_to_the_step():
    rng = np.random.default_rng(36)
    for _ in range(500):
        step, compute, wait = rng.uniform(0, 0.05, size=3)
        s = StepShares.split(step, compute=compute, input_wait=wait)
        assert s.step == pytest.approx(step)
        assert s.compute == pytest.approx(min(step, compute))
        assert s.input_wait == pytest.approx(min(step - s.compute, wait))
        assert min(s.compute, s.input_wait, s.other) >= 0
        assert sum(s.fractions().values()) == pytest.approx(1.0)
        assert sum(s.percents().values()) == 100  # as printed, too
        assert s.not_computing == pytest.approx(1 - s.fraction("compute"))


def test_shares_of_a_step_of_no_time_are_zero_not_an_error():
    s = StepShares.split(0.0, compute=0.01, input_wait=0.01)
    assert s.fractions() == {"compute": 0.0, "input_wait": 0.0, "other": 0.0}
    assert s.percents() == {"compute": 0, "input_wait": 0, "other": 0}


@pytest.mark.parametrize("times", [HAND_OFF, STARVED], ids=["hand-off", "starved"])
def test_text_picture_dict_and_fractions_are_one_accounting(times):
    d = Diagnosis(times, batch_size=32)
    pct = d.shares.percents()
    text = str(d)
    assert _shares_in(text) == pct
    assert f"{100 - pct['compute']}% of each step not spent computing" in text.splitlines()[0]
    assert d.input_wait_fraction == pytest.approx(d.shares.fraction("input_wait"))
    assert d.lost_fraction == pytest.approx(d.shares.not_computing)
    assert d.to_dict()["shares"] == pytest.approx(d.shares.fractions())
    # The picture's header and legend: the same numbers under the same names.
    from matplotlib.figure import Figure

    fig = Figure()
    plot._header(fig, d)
    header = "\n".join(t.get_text() for t in fig.texts)
    assert f"{100 - pct['compute']}% of each step not spent computing" in header
    for part in PARTS:
        assert f"{LABELS[part].split(' (')[0]} ({pct[part]}%)" in header, header
    ax = fig.add_subplot()
    plot._draw_steps(ax, d)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [f"{LABELS[p]}: {pct[p]}%" for p in PARTS] == [t for t in legend if t != "new epoch"]


def test_per_step_breakdown_is_the_same_split_and_adds_up_to_each_step():
    times = {**STARVED, "end_to_end": [0.0081, 0.004, 0.02, 0.0081]}
    d = Diagnosis(times, batch_size=32)
    parts = d.step_breakdown()
    np.testing.assert_allclose(sum(parts.values()), times["end_to_end"])
    for i, step in enumerate(times["end_to_end"]):
        s = StepShares.split(step, compute=0.0037, input_wait=0.0073 - 0.0037)
        assert [parts[p][i] for p in PARTS] == pytest.approx([s.compute, s.input_wait, s.other])


def test_time_lost_handing_batches_over_is_not_called_input_bound():
    # Before: "INPUT-BOUND (64% of step time not spent computing)", advice to raise the workers, and 1% of the
    # step waiting for input. The lost time is other time: it is not the input's, and more workers would not help.
    d = Diagnosis(HAND_OFF, batch_size=32, data_kind="FastLoader", workers=2, current={"max_queue_size": 8})
    assert d.shares.percents()["other"] > 50 and d.shares.percents()["input_wait"] <= 1
    assert d.verdict != "input-bound", str(d)
    assert not any("raise the loader's workers" in r for r in d.recommendations), d.recommendations
    assert "other time (hand-off, conversion, framework)" in d.recommendations[0]
    assert "raise the loader's max_queue_size from 8 to 16" in d.recommendations[0]


def test_a_starved_step_is_input_bound_and_its_input_wait_is_what_the_verdict_reads():
    d = Diagnosis(STARVED, batch_size=32, data_kind="FastLoader", workers=1)
    assert d.verdict == "input-bound", str(d)
    assert d.shares.input_wait >= d.shares.other
    assert f"{d.shares.percents()['input_wait']}% of each step is spent waiting for input" in d.recommendations[0]
