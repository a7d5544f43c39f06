"""What a diagnosis tells the user to change, naming only what accepts the data they gave: FastLoader for
Python datasets it can wrap, tf.data's own knobs and `kfast.tune` for a `tf.data.Dataset`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kfast.diagnosis.verdict import COMPUTE_BOUND
from kfast.diagnosis.verdict import INPUT_BOUND

TF_DATA = "tf.data.Dataset"


@dataclass(frozen=True)
class Facts:
    """What the advice is drawn from (seconds per step at the typical times)."""

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


def _feed_more(f: Facts) -> list[str]:
    b = f.batch_size
    feed = (f"input delivers {b / f.t_in:.0f} samples/s, the model consumes {b / f.t_comp:.0f}; "
            f"{f.lost:.0%} of each step is lost waiting for data")
    need = math.ceil((f.workers or 1) * f.t_in / f.t_comp)
    if f.data_kind == "FastLoader":
        out = [f"{feed}: raise the loader's workers from {f.workers} to {min(need, 2 * f.cpus)} or let "
               "kfast.tune(dataset) pick them."]
    elif f.data_kind == TF_DATA:
        out = [f"{feed}: let kfast.tune(dataset, model=model) tune the pipeline, or set tf.data's own knobs: "
               "map(..., num_parallel_calls=tf.data.AUTOTUNE) for the per-element work and "
               ".prefetch(tf.data.AUTOTUNE) at the end."]
    elif f.indexable:
        out = [f"{feed}: wrap the dataset in kfast.data.FastLoader(dataset, workers={min(need, f.cpus)}) to load "
               "batches in parallel processes."]
    else:
        out = [f"{feed}: serve the batches from a keras.utils.PyDataset (__len__, and __getitem__ returning batch "
               f"i), which kfast.data.FastLoader(dataset, workers={min(need, f.cpus)}) then loads in parallel "
               "processes."]
    if need > f.cpus:
        cheaper = ("cheaper map functions (cache() what is decoded once, smaller images)" if f.data_kind == TF_DATA
                   else "a cheaper __getitem__ (decode once and cache, smaller images, vectorised numpy)")
        out.append(f"loading a batch costs {need}x a training step of CPU time but this machine has {f.cpus} "
                   f"core(s): {cheaper}, or move augmentation into the model.")
    return out


def _load_ahead(f: Facts) -> str:
    if f.data_kind == "FastLoader":
        return "raise the loader's max_queue_size"
    if f.data_kind == TF_DATA:
        return "end the pipeline with .prefetch(tf.data.AUTOTUNE)"
    if f.indexable:
        return "load batches ahead with kfast.data.FastLoader(dataset) (its max_queue_size)"
    return "load batches ahead (a keras.utils.PyDataset in kfast.data.FastLoader)"


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
    if f.likely != COMPUTE_BOUND and f.t_in > f.t_comp:
        out += _feed_more(f)
    elif f.lost >= 0.10:
        out.append(f"the input alone is fast ({f.batch_size / f.t_in:.0f} samples/s) but {f.lost:.0%} of each step "
                   "is lost handing batches over: compile with steps_per_execution > 1 to run several steps per "
                   f"call, and {_load_ahead(f)}.")
    if f.gpu_idle is not None and f.gpu_idle > 0.2 and f.likely != COMPUTE_BOUND:
        out.append(f"the GPU was idle in {f.gpu_idle:.0%} of samples during training: {_load_ahead(f)} so more "
                   "batches are ready ahead.")
    if f.likely != INPUT_BOUND:
        out.append(f"the model is the limit at {f.batch_size / f.t_comp:.0f} samples/s: try a larger batch size if "
                   "memory allows, mixed precision (keras.mixed_precision.set_global_policy('mixed_float16')) on "
                   "GPUs with tensor cores, or more GPUs with horovodrun.")
    return out
