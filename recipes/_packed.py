"""Packed shards (`kfast pack`) as a recipe's `--data`: a folder holding `kfast-pack.json`, or `s3://...`."""

from __future__ import annotations

import argparse
import os
from typing import Any


def is_pack(path: str) -> bool:
    """Whether `--data` names a pack rather than a folder of files."""
    from kfast.data.packed import layout

    return path.startswith("s3://") or os.path.exists(os.path.join(path, layout.META_NAME))


def packed_images(args: argparse.Namespace) -> tuple[Any, Any, int]:
    """Training and validation data from a pack (`kfast pack FOLDER OUTPUT`): a fifth held out, by `--seed`."""
    from kfast import distributed
    from kfast.data import PackedDataset

    size = (args.image_size, args.image_size)
    common = {"batch_size": args.batch_size, "seed": args.seed, "image_size": size, "validation_split": 0.2,
              "on_bad_record": "skip" if args.skip_bad_files else "raise"}
    train = PackedDataset(args.data, subset="training", **common)
    val = PackedDataset(args.data, subset="validation", shuffle=False, **common)
    if distributed.is_chief():
        print(f"--data {args.data}: packed shards, {train.num_samples + val.num_samples} samples in "
              f"{len(train.info.shards)} shard(s), {len(train.classes or [])} classes", flush=True)
    return train, val, len(train.classes or [])
