"""tabular: an MLP classifier on a CSV or NumPy file, or on synthetic data.

    kfast train tabular                              # synthetic data
    kfast train tabular --make-sample data.csv       # write a small CSV (last column: the label)
    kfast train tabular --data data.csv              # CSV with a header row, label in the last column
    kfast train tabular --data data.npz              # arrays `x` (samples, features) and `y` (int labels)
"""

import os
import sys

import keras
import numpy as np

SUMMARY = "MLP classifier on a CSV (label in the last column) or .npz file (x, y), or synthetic data"


def add_arguments(parser):
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=5, batch_size=64, lr=3e-3)
    parser.add_argument("--features", type=int, default=16, help="features of synthetic data (default 16)")
    parser.add_argument("--samples", type=int, default=4096, help="synthetic samples (default 4096)")


def synthetic(samples, features, seed=0):
    """A learnable task: the label says which of 3 random directions the sample leans along most."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, features)).astype("float32")
    directions = np.random.default_rng(1234).normal(size=(features, 3)).astype("float32")
    return x, np.argmax(x @ directions, axis=1).astype("int32")


def read(path):
    """Returns `(x, y)` from a .npz with `x` and `y`, or a CSV with a header and the label last."""
    if path.endswith(".npz"):
        with np.load(path) as f:
            if "x" not in f or "y" not in f:
                raise ValueError(f"{path} must hold arrays named 'x' and 'y'; it holds {sorted(f.files)}.")
            return f["x"].astype("float32"), f["y"].astype("int32")
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype="float32", ndmin=2)
    if table.shape[1] < 2:
        raise ValueError(f"{path} needs at least one feature column and a label column; got {table.shape[1]} column(s).")
    return table[:, :-1], table[:, -1].astype("int32")


def write_sample(path, samples=512, features=8, seed=0):
    """Writes a small CSV: `features` columns f0..fN and a `label` column."""
    x, y = synthetic(samples, features, seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = ",".join([f"f{i}" for i in range(features)] + ["label"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%.6g")
    return path


def build(args):
    from kfast import distributed
    from kfast.data import ArrayDataset
    from kfast.recipes import _common

    x, y = read(args.data) if args.data else synthetic(args.samples, args.features, args.seed)
    order = np.random.default_rng(args.seed).permutation(len(x))
    n_val = max(args.batch_size * distributed.size(), len(x) // 8)  # a batch per rank at least
    val_rows, train_rows = order[:n_val], order[n_val:]
    # Standardise with training statistics only.
    mean, std = x[train_rows].mean(axis=0), x[train_rows].std(axis=0) + 1e-6
    x = (x - mean) / std
    classes = int(y.max()) + 1
    train = ArrayDataset(x[train_rows], y[train_rows], batch_size=args.batch_size, shuffle=True, seed=args.seed)
    val = ArrayDataset(x[val_rows], y[val_rows], batch_size=args.batch_size)
    net = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(classes)], name="mlp")
    return _common.assemble(net, train, val, args)


def main(argv=None):
    from kfast.recipes import run

    run("tabular", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
