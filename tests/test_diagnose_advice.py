"""`kfast.diagnose`'s advice: every branch of kfast/diagnosis/advice.py names an action, and none proposes the
value already set (issue 36: "raise the loader's workers from 4 to 4" at the cap of twice the cores)."""

import dataclasses
import re

import pytest

from kfast.diagnosis import advice
from kfast.diagnosis.verdict import BALANCED
from kfast.diagnosis.verdict import COMPUTE_BOUND
from kfast.diagnosis.verdict import INPUT_BOUND
from kfast.diagnosis.verdict import shares

CPUS = 2
CAP = 2 * CPUS

# Each piece of advice tells the user to do something: it holds one of these imperatives.
ACTIONS = ("raise", "wrap", "serve", "let kfast.tune", "set ", "compile with", "end the pipeline", "load batches",
           "make loading cheaper", "move augmentation", "try ", "leave self", "run it again")


def _facts(*, t_in, t_comp, t_e2e, kind="FastLoader", workers=2, likely=None, could_be=None, overlapped=True,
           **more):
    s = shares(t_in, t_comp, t_e2e, overlapped).fractions()
    likely = likely or INPUT_BOUND
    given = {"gpu_idle": None, "dataset_changes": False, **more}
    return advice.Facts(likely=likely, could_be=tuple(could_be or (likely,)), lost=1 - s["compute"],
                        lost_range=(1 - s["compute"], 1 - s["compute"]), t_in=t_in, t_comp=t_comp, batch_size=32,
                        data_kind=kind, indexable=kind != "generator",
                        workers=workers if kind == "FastLoader" else None, cpus=CPUS, input_wait=s["input_wait"], other=s["other"], **given)


# name: (facts, a phrase the advice of that branch holds)
BRANCHES = {
    "dataset changes": (_facts(t_in=0.001, t_comp=0.01, t_e2e=0.0102, likely=COMPUTE_BOUND, dataset_changes=True),
                        "leave self as it was"),
    "uncertain": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, could_be=(INPUT_BOUND, BALANCED)),
                  "run it again with a larger budget_s"),
    "FastLoader below the cap": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, workers=1), "raise the loader's workers"),
    "FastLoader with enough workers by the arithmetic": (_facts(t_in=0.011, t_comp=0.01, t_e2e=0.0115, workers=3,
                                                                likely=BALANCED), "raise the loader's workers"),
    "FastLoader at the cap": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, workers=CAP), "the CPU is the limit"),
    "FastLoader above the cap": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, workers=4 * CPUS),
                                 "the CPU is the limit"),
    "tf.data": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, kind=advice.TF_DATA), "let kfast.tune(dataset, model"),
    "tf.data already prefetched": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, kind=advice.TF_DATA, prefetched=True,
                                          gpu_idle=0.5), "num_parallel_calls"),
    "indexable dataset": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, kind="SlowImages"), "wrap the dataset"),
    "indexable dataset, CPU-hungry": (_facts(t_in=0.2, t_comp=0.01, t_e2e=0.2, kind="SlowImages"),
                                      "make loading cheaper"),
    "iterable": (_facts(t_in=0.03, t_comp=0.01, t_e2e=0.03, kind="generator"), "serve the batches"),
    "hand-off": (_facts(t_in=0.011, t_comp=0.01, t_e2e=0.03, likely=BALANCED, max_queue_size=8),
                 "compile with steps_per_execution=8"),
    "hand-off, several steps per call already": (_facts(t_in=0.005, t_comp=0.01, t_e2e=0.03, likely=BALANCED,
                                                        steps_per_execution=8, max_queue_size=8),
                                                 "raise steps_per_execution from 8 to 16"),
    "GPU idle": (_facts(t_in=0.011, t_comp=0.01, t_e2e=0.0125, likely=BALANCED, gpu_idle=0.5, max_queue_size=8),
                 "raise the loader's max_queue_size from 8 to 16"),
    "GPU idle, tf.data": (_facts(t_in=0.011, t_comp=0.01, t_e2e=0.0125, kind=advice.TF_DATA, likely=BALANCED,
                                 gpu_idle=0.5), "end the pipeline with .prefetch"),
    "model is the limit": (_facts(t_in=0.001, t_comp=0.01, t_e2e=0.0102, likely=COMPUTE_BOUND), "mixed_float16"),
    "model is the limit, mixed precision already": (_facts(t_in=0.001, t_comp=0.01, t_e2e=0.0102,
                                                           likely=COMPUTE_BOUND, mixed_precision=True),
                                                    "larger batch size than 32"),
}


def _proposes_the_current_value(f, text):
    """What in `text` proposes a value `f` says is already set; empty when nothing does."""
    found = [m.group(0) for m in re.finditer(r"from (\d+) to (\d+)", text) if m.group(1) == m.group(2)]
    if f.data_kind == "FastLoader":
        found += re.findall(rf"workers={f.workers}\b|workers from \d+ to {f.workers}\b", text)
        if f.workers >= CAP:
            found += re.findall(r"raise the loader's workers|workers=\d+", text)
    if f.max_queue_size:
        found += re.findall(rf"max_queue_size (?:from \d+ )?to {f.max_queue_size}\b", text)
    found += re.findall(rf"steps_per_execution(?: from \d+ to |=){f.steps_per_execution}\b", text)
    if f.steps_per_execution > 1:
        found += re.findall(r"steps_per_execution > 1|compile with steps_per_execution", text)
    if f.mixed_precision:
        found += re.findall(r"mixed_float16|mixed precision", text)
    if f.prefetched:
        found += re.findall(r"\.prefetch\(", text)
    return found


@pytest.mark.parametrize("name", sorted(BRANCHES))
def test_every_advice_branch_names_an_action_and_never_the_value_already_set(name):
    facts, phrase = BRANCHES[name]
    out = advice.recommend(facts)
    assert out, name
    assert any(phrase in r for r in out), (name, out)
    for r in out:
        assert any(action in r for action in ACTIONS), (name, r)
        assert not _proposes_the_current_value(facts, r), (name, r, _proposes_the_current_value(facts, r))


def test_the_branches_cover_every_recommendation_path():
    # Each helper of advice.py that writes advice, and each data kind of _feed_more, is reached above.
    texts = " ".join(r for facts, _ in BRANCHES.values() for r in advice.recommend(facts))
    for phrase in ("leave self as it was", "does not settle it", "raise the loader's workers", "the CPU is the limit",
                   "let kfast.tune(dataset, model=model) tune the pipeline", "wrap the dataset",
                   "serve the batches from a keras.utils.PyDataset", "loading a batch costs",
                   "other time (hand-off, conversion, framework)", "raise steps_per_execution", "the GPU was idle",
                   "the model is the limit", "max_queue_size from", "end the pipeline", "size the pipeline's"):
        assert phrase in texts, phrase


def test_at_the_cap_the_advice_says_the_cpu_is_the_limit_and_how_to_load_cheaper():
    # The demo's tuned loader: 4 workers on 2 cores, input slower than the model.
    out = advice.recommend(_facts(t_in=0.0073, t_comp=0.0037, t_e2e=0.0075, workers=CAP))
    first = out[0]
    assert f"already runs {CAP} workers, twice this machine's {CPUS} core(s)" in first, out
    assert "the CPU is the limit" in first and "fill_batch(index, out)" in first and "cache" in first, out
    assert "from 4 to 4" not in " ".join(out)


def test_below_the_cap_the_workers_go_up_never_down_or_sideways():
    for workers in range(1, CAP):
        for t_in in (0.0101, 0.015, 0.03, 0.2):
            f = _facts(t_in=t_in, t_comp=0.01, t_e2e=t_in, workers=workers)
            text = advice.recommend(f)[0]
            proposed = int(re.search(r"workers from \d+ to (\d+)", text).group(1))
            assert workers < proposed <= CAP, (workers, t_in, text)


def test_handing_batches_over_is_not_advised_as_a_slow_input():
    # 67% of the step is not computing, but the input alone costs the step 1 ms of it: the rest is hand-off.
    f = _facts(t_in=0.011, t_comp=0.01, t_e2e=0.03, likely=BALANCED, max_queue_size=8)
    out = advice.recommend(f)
    assert not any("raise the loader's workers" in r for r in out), out
    assert out[0].startswith("63% of each step is other time (hand-off, conversion, framework)"), out


def test_facts_are_frozen():
    facts, _ = BRANCHES["hand-off"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.workers = 3
