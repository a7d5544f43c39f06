"""`make demo`, part one: a model starved by its input, diagnosed, tuned by kfast, and diagnosed again.

The dataset's `__getitem__` does what slow input pipelines do: some Python work that holds the GIL
(decoding, augmenting) and a wait on storage (a read from network disk, stood in for by a sleep of a fixed
time). Keras's PyDataset, as most users leave it (`workers=1`, no processes), loads one batch at a time
inside the training loop. `kfast.tune` measures settings with the model training and picks the workers
that feed it; the second diagnosis shows what changed. Prints both side by side and writes both pictures.
The table's shares of a step (compute, input wait, other) are the diagnoses' own (`Diagnosis.shares`), the
numbers their text and pictures show.

    python scripts/demo_starved.py OUT_DIR [--batches N] [--budget S]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import kfast

STORAGE_WAIT_S = 0.02  # a batch's read from storage: the worker waits, the CPU is free
PYTHON_WORK_S = 0.003  # a batch's decode and augmentation in pure Python: holds the GIL


class SlowImages(keras.utils.PyDataset):
    """Batches of 32 small images, each batch costing a storage wait and some GIL-holding Python work."""

    def __init__(self, batches: int, **kwargs):
        super().__init__(**kwargs)
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, index: int):
        time.sleep(STORAGE_WAIT_S)
        end = time.perf_counter() + PYTHON_WORK_S
        while time.perf_counter() < end:  # Python-level work: holds the GIL, as a decode loop would
            pass
        rng = np.random.default_rng(index)
        x = rng.random((32, 16, 16, 3), dtype=np.float32)
        return x, (x.mean(axis=(1, 2, 3)) > 0.5).astype("float32")


def build_model() -> keras.Model:
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    return model


def row(name: str, before: str, after: str) -> str:
    return f"  {name:<26}{before:>22}{after:>22}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds for kfast.tune")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(0)
    model, dataset = build_model(), SlowImages(args.batches)

    print("== 1. kfast.diagnose(model, dataset): the PyDataset as Keras runs it (one batch at a time)")
    before = kfast.diagnose(model, dataset)
    print(before)
    before.plot(os.path.join(args.out, "before.png"))

    print(f"\n== 2. kfast.tune(dataset, model=model, budget_s={args.budget:g})")
    result = kfast.tune(dataset, model=model, budget_s=args.budget)
    print(result)

    with result.loader(dataset) as loader:
        print("\n== 3. kfast.diagnose(model, loader): the same model fed by the tuned FastLoader")
        after = kfast.diagnose(model, loader)
        print(after)
        after.plot(os.path.join(args.out, "after.png"))

    print("\n== Before and after")
    print(row("", "PyDataset", f"FastLoader({result.settings.workers} workers)"))
    print(row("verdict", before.verdict, after.verdict))
    # One accounting (kfast._core.step_shares): the same shares, names and rounding as the diagnoses print.
    was, now, labels = before.shares.percents(), after.shares.percents(), after.shares.labels()
    for part, label in labels.items():
        print(row(f"{label.split(' (')[0]}, % of step", f"{was[part]}%", f"{now[part]}%"))
    print(row("training steps/s", f"{before.end_to_end_steps_per_s:.1f}", f"{after.end_to_end_steps_per_s:.1f}"))
    print(row("model alone, steps/s", f"{before.compute_steps_per_s:.1f}", f"{after.compute_steps_per_s:.1f}"))
    speedup = after.end_to_end_steps_per_s / before.end_to_end_steps_per_s
    print(f"\n  other = {labels['other']}")
    print(f"  {speedup:.1f}x the training steps/s; pictures: {args.out}/before.png, {args.out}/after.png")


if __name__ == "__main__":
    main()
