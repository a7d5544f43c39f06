"""`kfast.diagnose`'s numbers against a known truth (a stand-in accelerator, datasets with a known load
time), its verdict on repeated runs, and its time budget.

Timing-sensitive: the machine's cores are shared with other processes, which can stretch single steps;
the stand-in's steps and loads are sleeps (no CPU used), so such noise moves them little.
"""

import time

import keras
import numpy as np
import pytest

import datasets
import kfast
from accelerator import Loading, Paced, fixed_step_model, step_seconds, wait_share
from helpers import DOCS_PRELUDE
from kfast.diagnosis.report import Diagnosis

STEP = 0.03  # the stand-in accelerator's step: 30 ms of wall time, the host idle


@pytest.mark.parametrize("pace", [0.5, 1.5, 3.0], ids=["about-0", "about-33", "about-67"])
def test_the_input_wait_share_is_within_5_points_of_the_truth(pace):
    model = fixed_step_model(STEP)
    step = step_seconds(model)  # the stand-in's 30 ms plus what Keras adds to each step on this backend
    # Keras's two threads load ahead while the model computes: a batch is ready every `every` seconds.
    every = pace * step
    truth = wait_share(every, step)
    d = kfast.diagnose(model, Paced(every), steps=16, warmup=5)
    assert abs(d.input_wait_fraction - truth) <= 0.05, (truth, str(d))
    assert abs(d.lost_fraction - truth) <= 0.05
    assert d.step_ranges["compute"][1] == pytest.approx(step, abs=0.003)
    assert d.step_ranges["input"][1] == pytest.approx(every, abs=0.003)


def test_two_workers_bursts_are_measured_as_training_gets_them():
    model = fixed_step_model(STEP)
    step = step_seconds(model)
    # Each of two threads takes 3 steps' time a batch: a step that waited, then one that did not; on
    # average a batch every 1.5 steps. An odd number of steps holds one more of a kind: their median is it.
    truth = wait_share(1.5 * step, step)
    d = kfast.diagnose(model, Loading(3 * step, workers=2), steps=15, warmup=3)
    assert abs(d.input_wait_fraction - truth) <= 0.05, (truth, str(d))


def test_five_runs_on_the_same_model_and_data_give_the_same_verdict():
    # As five separate runs: a fresh twin of the model each time (its step traced anew), the same data.
    # Two threads take 4.4 steps' time a batch: a batch every 2.2 steps on average, in bursts.
    step = step_seconds(fixed_step_model(0.015))
    data = Loading(4.4 * step, workers=2)
    truth = wait_share(2.2 * step, step)
    runs = [kfast.diagnose(fixed_step_model(0.015), data, steps=9, warmup=2) for _ in range(5)]
    # A run's median step was either kind, and a step traced anew let the threads fill their queue first:
    # near a threshold the verdicts of such runs went balanced, input-bound, compute-bound, ...
    assert [d.verdict for d in runs] == ["input-bound"] * 5, [str(d) for d in runs]
    # Nine steps a phase on a shared machine: each run's share within 10 points (such runs were 15 off).
    assert all(abs(d.input_wait_fraction - truth) <= 0.1 for d in runs), (truth, [d.input_wait_fraction for d in runs])


def test_overlapping_ranges_give_an_uncertain_verdict_that_names_both():
    # Stretches of two steps: end to end 5% to 25% slower than compute, as a busy machine can make it.
    compute = [0.010] * 12
    end_to_end = [t for t in (0.0105, 0.0110, 0.0115, 0.0120, 0.0125, 0.0110) for _ in range(2)]
    d = Diagnosis({"input": [0.008] * 12, "compute": compute, "end_to_end": end_to_end}, batch_size=8)
    assert d.verdict == "uncertain" and set(d.could_be) == {"balanced", "compute-bound"}
    low, high = d.lost_range
    assert low < 0.10 <= high and low <= d.lost_fraction <= high
    assert str(d).startswith("kfast diagnosis: UNCERTAIN (could be ")
    assert "does not settle it" in d.recommendations[0] and "budget_s" in d.recommendations[0]
    assert d.to_dict()["could_be"] == d.could_be
    # Apart, the same medians give one verdict.
    clear = Diagnosis({"input": [0.008] * 12, "compute": [0.010] * 12, "end_to_end": [0.0101] * 12}, batch_size=8)
    assert clear.verdict == "compute-bound" and clear.could_be == ["compute-bound"]


def test_each_phase_stops_at_its_share_of_the_budget_after_the_least_steps():
    model = fixed_step_model(0.05)
    data = datasets.Features(n=200, width=4, delay=0.05)
    began = time.perf_counter()
    d = kfast.diagnose(model, data, steps=1000, warmup=1, budget_s=3)
    elapsed = time.perf_counter() - began
    counts = [len(d.times[k]) for k in ("input", "compute", "end_to_end")]
    # About a second a phase at 50-60 ms a step: far fewer than 1000 steps, at least the 6 of a range.
    assert all(6 <= n <= 25 for n in counts), counts
    # Past the budget by at most a step or two per phase and fit's start and end (see the quick start test).
    assert elapsed < 3 + 2.5, elapsed
    # A budget too short for anything: the least steps, and no more.
    tight = kfast.diagnose(model, data, steps=1000, warmup=1, budget_s=0.01)
    assert [len(tight.times[k]) for k in ("input", "compute", "end_to_end")] == [6, 6, 6]


def test_the_readme_quick_start_model_is_diagnosed_within_the_default_budget():
    scope = {}
    exec(DOCS_PRELUDE, scope)  # README's model and dataset, as the quick start finds them
    model, dataset = scope["model"], scope["dataset"]
    budget_s = 20.0  # diagnose's default
    began = time.perf_counter()
    d = kfast.diagnose(model, dataset)  # exactly as README's quick start calls it
    elapsed = time.perf_counter() - began
    # The margin: what diagnose does outside the three phases' shares (probing NVML, reading the first
    # batch, building the Diagnosis: milliseconds) and past a phase's deadline (the step under way, and
    # fit's own start and end: an iterator, Keras's look at two batches). Tracing the train step falls
    # inside the compute phase. 5 s covers those on a busy 2-core machine with room to spare.
    assert elapsed < budget_s + 5, elapsed
    assert len(d.times["end_to_end"]) == 50 and d.batch_size == 32
    keras.backend.clear_session()
