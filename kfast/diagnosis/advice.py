"""What a diagnosis tells the user to change, naming only what accepts the data they gave: FastLoader for
Python datasets it can wrap, tf.data's own knobs and `kfast.tune` for a `tf.data.Dataset`.

Every piece of advice is an action, never the value already set: a loader at the most workers the advice
proposes (twice the cores) is told that the CPU is the limit and how to make loading cheaper, a model
already on mixed precision is not told to use it, and `steps_per_execution` and `max_queue_size` are
raised from what they are (tests/test_diagnose_advice.py walks every branch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kfast.diagnosis.verdict import COMPUTE_BOUND
from kfast.diagnosis.verdict import INPUT_BOUND

TF_DATA = "tf.data.Dataset"


@dataclass(frozen=True)
class Facts:
    """What the advice is drawn from: seconds per step at the typical times, the step's shares (see
    `kfast._core.step_shares`), and what the user already set, so that no advice repeats it."""

    likely: str
    could_be: tuple[str, ...]
    lost: float
    lost_range: tuple[float, float]
    t_in: float
    t_comp: float
    batch_size: int
    data_kind: str
    indexable: bool
    workers: int | None
    cpus: int
    gpu_idle: float | None
    dataset_changes: bool
    input_wait: float = 0.0
    other: float = 0.0
    max_queue_size: int | None = None
    steps_per_execution: int = 1
    mixed_precision: bool = False
    prefetched: bool = False


def most_workers(cpus: int) -> int:
    """The most loader workers the advice proposes, as `kfast.tune` tries: twice the usable cores (a worker
    that waits on storage leaves its core to another)."""
    return 2 * cpus


def _cheaper(f: Facts) -> str:
    if f.data_kind == TF_DATA:
        return ("cheaper map functions: cache() what is decoded once, decode to smaller images, vectorised ops "
                "with batch() before map()")
    return ("fill_batch(index, out), which writes a batch in place instead of building new arrays, lighter "
            "decoding (decode once and cache, smaller images), vectorised numpy")


def _feed_more(f: Facts) -> list[str]:
    b = f.batch_size
    feed = (f"input delivers {b / f.t_in:.0f} samples/s, the model consumes {b / f.t_comp:.0f}; "
            f"{f.input_wait:.0%} of each step is spent waiting for input")
    need = math.ceil((f.workers or 1) * f.t_in / f.t_comp)
    cap = most_workers(f.cpus)
    if f.data_kind == "FastLoader" and (f.workers or 1) >= cap:
        # More workers than this only compete for the same cores: the cost of a batch is what to change.
        return [f"{feed}: the loader already runs {f.workers} workers, twice this machine's {f.cpus} core(s), so "
                f"the CPU is the limit: make loading cheaper with {_cheaper(f)}; or move augmentation into the "
                "model."]
    if f.data_kind == "FastLoader":
        more = min(max(need, (f.workers or 1) + 1), cap)
        out = [f"{feed}: raise the loader's workers from {f.workers or 1} to {more} or let kfast.tune(dataset) "
               "pick them."]
    elif f.data_kind == TF_DATA:
        knobs = "map(..., num_parallel_calls=tf.data.AUTOTUNE) for the per-element work"
        if not f.prefetched:
            knobs += " and .prefetch(tf.data.AUTOTUNE) at the end"
        out = [f"{feed}: let kfast.tune(dataset, model=model) tune the pipeline, or set tf.data's own knobs: "
               f"{knobs}."]
    elif f.indexable:
        out = [f"{feed}: wrap the dataset in kfast.data.FastLoader(dataset, workers={max(1, min(need, f.cpus))}) "
               "to load batches in parallel processes."]
    else:
        out = [f"{feed}: serve the batches from a keras.utils.PyDataset (__len__, and __getitem__ returning batch "
               f"i), which kfast.data.FastLoader(dataset, workers={max(1, min(need, f.cpus))}) then loads in "
               "parallel processes."]
    if need > f.cpus:
        out.append(f"loading a batch costs {need}x a training step of CPU time but this machine has {f.cpus} "
                   f"core(s): make loading cheaper with {_cheaper(f)}; or move augmentation into the model.")
    return out


def _load_ahead(f: Facts) -> str:
    if f.data_kind == "FastLoader":
        if f.max_queue_size:
            return f"raise the loader's max_queue_size from {f.max_queue_size} to {2 * f.max_queue_size}"
        return "raise the loader's max_queue_size"
    if f.data_kind == TF_DATA:
        if f.prefetched:
            return "let kfast.tune(dataset, model=model) size the pipeline's parallel calls and buffers"
        return "end the pipeline with .prefetch(tf.data.AUTOTUNE)"
    if f.indexable:
        return "load batches ahead with kfast.data.FastLoader(dataset) (its max_queue_size)"
    return "load batches ahead (a keras.utils.PyDataset in kfast.data.FastLoader)"


def _hand_off(f: Facts) -> str:
    spe = max(1, f.steps_per_execution)
    # Several steps per call spread the hand-over of each call over them; 8 is a common first step up.
    more = 8 if spe == 1 else 2 * spe
    spe_text = (f"compile with steps_per_execution={more} to run several steps per call" if spe == 1 else
                f"raise steps_per_execution from {spe} to {more}")
    return (f"{f.other:.0%} of each step is other time (hand-off, conversion, framework), neither computing nor "
            f"waiting for input: {spe_text}, and {_load_ahead(f)}.")


def _model_limit(f: Facts) -> str:
    mixed = ("" if f.mixed_precision else "mixed precision (keras.mixed_precision.set_global_policy("
             "'mixed_float16')) on GPUs with tensor cores, ")
    return (f"the model is the limit at {f.batch_size / f.t_comp:.0f} samples/s: try a larger batch size than "
            f"{f.batch_size} if memory allows, {mixed}or more GPUs with horovodrun.")


def recommend(f: Facts) -> list[str]:
    """What to change, most important first: a dataset that changes while it serves (it changes training
    too), then whether the measurement settles the verdict, then the advice of the likeliest verdict."""
    out: list[str] = []
    if f.dataset_changes:
        out.append("the dataset changes while it serves (see Dataset above), and training for several epochs sees "
                   "the changed batches too: leave self as it was in __getitem__ and on_epoch_end (compute the "
                   "last batch's size from the index instead of assigning to self).")
    if len(f.could_be) > 1:
        lo, hi = f.lost_range
        out.append(f"the measurement does not settle it: it could be {' or '.join(f.could_be)} ({lo:.0%} to {hi:.0%} "
                   "of each step not spent computing, over the phases' ranges); run it again with a larger budget_s "
                   f"and steps on an otherwise idle machine. For the likeliest, {f.likely}:")
    # Waiting for input calls for a faster input; other time does not, whatever the input alone does.
    if f.likely != COMPUTE_BOUND and f.t_in > f.t_comp and f.input_wait >= f.other:
        out += _feed_more(f)
    if f.other >= 0.10:
        out.append(_hand_off(f))
    if f.gpu_idle is not None and f.gpu_idle > 0.2 and f.likely != COMPUTE_BOUND:
        out.append(f"the GPU was idle in {f.gpu_idle:.0%} of samples during training: {_load_ahead(f)} so more "
                   "batches are ready ahead.")
    if f.likely != INPUT_BOUND:
        out.append(_model_limit(f))
    return out
