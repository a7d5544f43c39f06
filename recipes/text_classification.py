"""text-classification: token ids -> embedding -> pooling classifier, on text files or synthetic text.

    kfast train text-classification                      # synthetic documents
    kfast train text-classification --make-sample texts  # write texts/<class>.txt
    kfast train text-classification --data texts         # one <class>.txt per class, one document per line
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import keras
import numpy as np

if TYPE_CHECKING:
    import argparse

    from kfast.recipes._common import Recipe

SUMMARY = "embedding + pooling classifier on <class>.txt files (one document per line), or synthetic text"
_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=4, batch_size=32, lr=3e-3)
    parser.add_argument("--vocab", type=int, default=4096, help="hashed vocabulary size (default 4096)")
    parser.add_argument("--length", type=int, default=32, help="tokens per document (default 32)")
    parser.add_argument("--samples", type=int, default=2048, help="synthetic documents (default 2048)")


def tokenize(text: str, vocab: int, length: int) -> list[int]:
    """Lower-cased words hashed into [1, vocab) (0 pads), truncated or padded to `length`."""
    ids = [1 + zlib.crc32(w.encode()) % (vocab - 1) for w in text.lower().split()][:length]
    return ids + [0] * (length - len(ids))


def synthetic_docs(samples: int, seed: int = 0, classes: int = 3) -> tuple[list[str], list[int]]:
    """Documents of common words plus one class word repeated: learnable by word counts."""
    rng = np.random.default_rng(seed)
    docs: list[str] = []
    labels: list[int] = []
    for i in range(samples):
        label = i % classes
        words = list(rng.choice(_WORDS[classes:], size=12)) + [_WORDS[label]] * 3
        rng.shuffle(words)
        docs.append(" ".join(words))
        labels.append(label)
    return docs, labels


def read(directory: str) -> tuple[list[str], list[int], list[str]]:
    """Returns `(documents, labels, class_names)` from directory/<class>.txt files.

    Raises:
        ValueError: for fewer than two class files, a file with no documents, or one that is not UTF-8
            (naming the file and the byte offset of the first bad byte).
    """
    names = sorted(f[:-4] for f in os.listdir(directory) if f.endswith(".txt"))
    if len(names) < 2:
        raise ValueError(f"{directory!r} needs at least two <class>.txt files (one document per line); found {len(names)}.")
    docs: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(names):
        path = os.path.join(directory, f"{name}.txt")
        try:
            with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the first word
                lines = [line.strip() for line in f if line.strip()]
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        if not lines:
            raise ValueError(f"{path} holds no documents; each <class>.txt needs at least one non-blank line, or "
                             f"delete it to drop the class.")
        docs += lines
        labels += [label] * len(lines)
    return docs, labels, names


def _not_utf8(path: str) -> ValueError:
    # A text file's decoding error gives an offset into one buffered chunk: decode the whole file for the
    # offset a hex editor would show.
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return ValueError(f"{path} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}) "
                          f"cannot be decoded ({e.reason}), so the file is in another encoding, such as Latin-1. "
                          f"Re-encode it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old.txt > new.txt`), then train "
                          f"again.")
    return ValueError(f"{path} is not valid UTF-8; re-encode it as UTF-8, then train again.")


def write_sample(directory: str, per_class: int = 100, seed: int = 0) -> str:
    """Writes directory/<class>.txt for three classes of synthetic documents."""
    docs, labels = synthetic_docs(3 * per_class, seed)
    os.makedirs(directory, exist_ok=True)
    for label, name in enumerate(_WORDS[:3]):
        with open(os.path.join(directory, f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(d for d, y in zip(docs, labels) if y == label) + "\n")
    return directory


def build(args: argparse.Namespace) -> Recipe:
    from kfast.recipes import _common

    if args.data:
        docs, labels, names = read(args.data)
    else:
        docs, labels = synthetic_docs(args.samples, args.seed)
        names = _WORDS[:3]
    x = np.array([tokenize(d, args.vocab, args.length) for d in docs], dtype="int32")
    y = np.array(labels, dtype="int32")
    train, val = _common.array_datasets(x, y, *_common.split_rows(len(x), args), args)
    net = keras.Sequential([keras.Input((args.length,), dtype="int32"), keras.layers.Embedding(args.vocab, 32),
                            keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(len(names))], name="bag_of_embeddings")
    return _common.assemble(net, train, val, args)


def main(argv: Sequence[str] | None = None) -> None:
    from kfast.recipes._common import run

    run("text-classification", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
