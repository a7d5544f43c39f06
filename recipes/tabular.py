"""tabular: an MLP classifier on a CSV or NumPy file, or on synthetic data.

    kfast train tabular                              # synthetic data
    kfast train tabular --make-sample data.csv       # write a small CSV (last column: the label)
    kfast train tabular --data data.csv              # CSV with a header row, label in the last column
    kfast train tabular --data data.npz              # arrays `x` (samples, features) and `y` (int labels)
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import keras
import numpy as np

if TYPE_CHECKING:
    import argparse

    from kfast.recipes._common import Recipe

SUMMARY = "MLP classifier on a CSV (label in the last column) or .npz file (x, y), or synthetic data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=5, batch_size=64, lr=3e-3)
    parser.add_argument("--features", type=int, default=16, help="features of synthetic data (default 16)")
    parser.add_argument("--samples", type=int, default=4096, help="synthetic samples (default 4096)")


def synthetic(samples: int, features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable task: the label says which of 3 random directions the sample leans along most."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, features)).astype("float32")
    directions = np.random.default_rng(1234).normal(size=(features, 3)).astype("float32")
    return x, np.argmax(x @ directions, axis=1).astype("int32")


def read(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(x, y)` from a .npz with `x` and `y`, or a CSV with a header and the label last.

    Raises:
        ValueError: naming the file, the row (a CSV line counted from 1 with the header as line 1, or an
            array index) and the column of the first bad value: a cell that is not a number, NaN or infinity
            anywhere, or a label that is not a class id 0, 1, 2, ...; also for fewer than two classes.
    """
    x, y = _read_npz(path) if path.endswith(".npz") else _read_csv(path)
    return x, y.astype("int32")


_LINE = "line {} (counting from 1, the header being line 1)"


def _data_lines(path: str) -> Iterator[tuple[int, list[str]]]:
    """Yields `(line number, cells)` for each row np.loadtxt reads from a CSV: not the header, blank or comment."""
    with open(path, encoding="utf-8", errors="replace") as f:
        next(f, None)
        for number, line in enumerate(f, start=2):
            line = line.split("#", 1)[0]
            if line.strip():
                yield number, line.split(",")


def _column(header: Sequence[str], c: int) -> str:
    return f"column {c + 1} ({header[c]!r})" if c < len(header) else f"column {c + 1}"


def _cell(path: str, header: Sequence[str], row: int, c: int) -> str:
    """Names the cell in column c of data row `row` (0-based, as np.loadtxt counts) as the user sees it."""
    line, cells = next(itertools.islice(_data_lines(path), row, None))
    c %= len(cells)
    return f"{path}, {_LINE.format(line)}, {_column(header, c)}: got {cells[c].strip()!r}"


def _read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, encoding="utf-8", errors="replace") as f:
        header = [name.strip() for name in f.readline().split(",")]
    if next(_data_lines(path), None) is None:
        raise ValueError(f"{path} has a header of {len(header)} column(s) and no data rows; add rows of numbers "
                         f"below the header (the label in the last column).")
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1, dtype="float32", ndmin=2)
    except ValueError as e:
        # numpy counts rows its own way: find the line and column as the user sees them.
        width: int | None = None
        for line, cells in _data_lines(path):
            width = width or len(cells)
            if len(cells) != width:
                raise ValueError(f"{path}, {_LINE.format(line)}: got {len(cells)} cells where the rows above have "
                                 f"{width}; every row needs one cell per column.") from e
            for c, cell in enumerate(cells):
                try:
                    float(cell)
                except ValueError:
                    raise ValueError(f"{path}, {_LINE.format(line)}, {_column(header, c)}: got {cell.strip()!r}; "
                                     f"expected a number. Fix the cell or drop its row, then train again.") from e
        raise ValueError(f"{path} cannot be read as a table of numbers: {e}") from e
    if table.shape[1] < 2:
        raise ValueError(f"{path} needs at least one feature column and a label column; got {table.shape[1]} "
                         f"column(s).")
    bad = np.argwhere(~np.isfinite(table))
    if len(bad):
        raise ValueError(f"{_cell(path, header, *bad[0])}; every cell must be a finite number, and {len(bad)} cell(s) "
                         f"are NaN or infinite. Fill them in or drop their rows (pandas: df.dropna()), then train "
                         f"again.")
    _check_labels(path, table[:, -1], lambda row: _cell(path, header, row, -1))
    return table[:, :-1], table[:, -1]


def _read_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as f:
        if "x" not in f or "y" not in f:
            raise ValueError(f"{path} must hold arrays named 'x' and 'y'; it holds {sorted(f.files)}.")
        x, y = f["x"], f["y"]
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{path} holds x of shape {x.shape} and y of shape {y.shape}; expected x of shape "
                         f"(samples, features) and y of shape (samples,).")
    for name, a in (("x", x), ("y", y)):
        bad = np.argwhere(~np.isfinite(a))
        if len(bad):
            at = ", ".join(str(i) for i in bad[0])
            raise ValueError(f"{path}: {name}[{at}] is {a[tuple(bad[0])]}; {name} must hold finite numbers, and "
                             f"{len(bad)} of its entries are NaN or infinite. Fill them in or drop those samples, "
                             f"then train again.")
    _check_labels(path, y, lambda i: f"{path}: y[{i}] is {y[i]}")
    return x.astype("float32"), y


def _check_labels(path: str, y: np.ndarray, where: Callable[[int], str]) -> None:
    """Raises unless `y` holds class ids (whole numbers >= 0) of two classes or more; `where(i)` names label i."""
    bad = np.flatnonzero((y != np.round(y)) | (y < 0))
    if len(bad):
        raise ValueError(f"{where(bad[0])}; labels must be class ids 0, 1, 2, ..., and {len(bad)} of {len(y)} are "
                         f"not. This recipe classifies: bin a continuous target into classes first.")
    values = np.unique(y)
    if len(values) < 2:
        raise ValueError(f"{path}: the labels hold {len(values)} class(es) {values.astype(int).tolist()} in {len(y)} "
                         f"rows; a classifier needs at least two. Check that the label is the last column (CSV) or y "
                         f"(.npz).")


def write_sample(path: str, samples: int = 512, features: int = 8, seed: int = 0) -> str:
    """Writes a small CSV: `features` columns f0..fN and a `label` column."""
    x, y = synthetic(samples, features, seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    header = ",".join([f"f{i}" for i in range(features)] + ["label"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%.6g")
    return path


def build(args: argparse.Namespace) -> Recipe:
    from kfast.recipes import _common

    x, y = read(args.data) if args.data else synthetic(args.samples, args.features, args.seed)
    train_rows, val_rows = _common.split_rows(len(x), args)
    # Standardise with training statistics only.
    mean, std = x[train_rows].mean(axis=0), x[train_rows].std(axis=0) + 1e-6
    x = (x - mean) / std
    classes = int(y.max()) + 1
    train, val = _common.array_datasets(x, y, train_rows, val_rows, args)
    net = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(classes)], name="mlp")
    return _common.assemble(net, train, val, args)


def main(argv: Sequence[str] | None = None) -> None:
    from kfast.recipes._common import run

    run("tabular", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
