"""`kfast pack`: the command line of `kfast.data.pack`."""

from __future__ import annotations

import argparse
import os

from kfast.cli._common import load_target


def add_pack(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "pack", help="pack a folder of class folders, a .npz of arrays or a dataset into ArrayRecord shards",
        description="Write SOURCE into OUTPUT as ArrayRecord shards and kfast-pack.json, which "
                    "kfast.data.PackedDataset reads. Run again after a stop: it goes on with the missing shards.")
    p.add_argument("source", metavar="SOURCE",
                   help="a folder with one sub-folder of images per class; a .npz file (arrays x and y, or any "
                        "names); or module:function / path/to/file.py:function returning a dataset of batches")
    p.add_argument("output", metavar="OUTPUT", help="the pack's folder")
    p.add_argument("--shard-size", type=int, default=None, help="samples per shard (default: about 64 MiB each)")
    p.add_argument("--workers", type=int, default=None, help="threads writing shards (default: one per core, 8 at most)")
    p.set_defaults(run=run_pack)


def run_pack(args: argparse.Namespace) -> int:
    import numpy as np

    from kfast.data.packed.writer import pack

    source: object = args.source
    if os.path.isfile(args.source) and args.source.endswith(".npz"):
        with np.load(args.source) as arrays:
            names = list(arrays.files)
            source = (arrays["x"], arrays["y"]) if sorted(names) == ["x", "y"] else {n: arrays[n] for n in names}
    elif not os.path.isdir(args.source) and ":" in args.source:
        source = load_target(args.source)()
    output = pack(source, args.output, shard_size=args.shard_size, workers=args.workers)
    print(f"packed {args.source} into {output}; read it with kfast.data.PackedDataset({output!r}, batch_size=...)")
    return 0
