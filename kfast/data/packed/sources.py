"""What `kfast.data.pack` packs: a folder of class folders, in-memory arrays, or any dataset of batches, each seen
as a numbered list of samples that shards are cut from. Keras-free."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from kfast.data.packed import layout

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


class Skip:
    """A source item that cannot be packed, and why (named in the pack's metadata)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _array_fields(values: list[Any], names: list[str], where: str) -> tuple[layout.Field, ...]:
    fields = []
    for name, value in zip(names, values):
        array = np.asarray(value)
        if array.dtype == object or array.dtype.kind in "USV":
            raise ValueError(f"kfast.data.pack got {where} field {name!r} of dtype {array.dtype}; it packs numeric "
                             "arrays and image files. Encode text as token arrays first.")
        fields.append(layout.Field(name, layout.ARRAY, array.dtype.str, tuple(array.shape)))
    return tuple(fields)


def _record(values: list[Any], fields: tuple[layout.Field, ...], where: str) -> bytes:
    out = []
    for field, value in zip(fields, values):
        if field.kind == layout.IMAGE:
            out.append(value)
            continue
        array = np.asarray(value)  # tobytes() writes C order whatever the layout
        if array.shape != field.shape or array.dtype.str != field.dtype:
            raise ValueError(f"kfast.data.pack: {where} has field {field.name!r} of {array.dtype} {array.shape}, but the "
                             f"first sample's was {np.dtype(field.dtype)} {field.shape}; every sample's field must "
                             "have one dtype and shape (pad or resize them first).")
        out.append(array.tobytes())
    return layout.encode(out)


class FolderSource:
    """Image files under `root/<class>/`: one listing, labels by sorted folder name; a file's header is checked
    when its shard is written (a file that does not open is left out and named)."""

    def __init__(self, root: str) -> None:
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
        files: list[tuple[str, int]] = []
        for label, name in enumerate(classes):
            files += [(e.path, label) for e in sorted(os.scandir(os.path.join(root, name)), key=lambda e: e.name)
                      if e.name.lower().endswith(IMAGE_EXTENSIONS)]
        if len(classes) < 1 or not files:
            raise ValueError(f"kfast.data.pack found no image files ({', '.join(IMAGE_EXTENSIONS)}) in class folders "
                             f"under {root!r}; it packs a folder with one sub-folder per class, or arrays.")
        self.files, self.count, self.classes = files, len(files), tuple(classes)
        self.fields = (layout.Field("image", layout.IMAGE), layout.Field("label", layout.ARRAY, "<i4", ()))
        self.structure, self.description = "xy", os.path.abspath(root)

    def records(self, start: int, stop: int) -> Iterator[bytes | Skip]:
        from PIL import Image

        for path, label in self.files[start:stop]:
            try:
                with open(path, "rb") as f:
                    data = f.read()
                with Image.open(io.BytesIO(data)):
                    pass  # the header names a format PIL decodes
            except Exception as e:  # noqa: BLE001 - any failure to open makes the file unusable
                yield Skip(f"{path}: {type(e).__name__}: {e}")
                continue
            yield layout.encode([data, np.int32(label).tobytes()])

    def sample_bytes(self) -> int:
        return max(1, os.path.getsize(self.files[0][0]))


class ArraySource:
    """Arrays with one sample per row: `x`, `(x, y)` or `{name: array}`."""

    def __init__(self, data: Any) -> None:
        if isinstance(data, dict):
            names, arrays, self.structure = [str(k) for k in data], [np.asarray(v) for v in data.values()], "dict"
        elif isinstance(data, (tuple, list)) and len(data) == 2:
            names, arrays, self.structure = ["x", "y"], [np.asarray(v) for v in data], "xy"
        else:
            names, arrays, self.structure = ["x"], [np.asarray(data)], "x"
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"kfast.data.pack got arrays of lengths {sorted(lengths)}; every array needs one row per "
                             "sample, the same number of rows.")
        self.arrays, self.count, self.classes = arrays, lengths.pop(), None
        if self.count < 1:
            raise ValueError("kfast.data.pack got arrays with no rows.")
        self.fields = _array_fields([a[0] for a in arrays], names, "arrays with")
        self.description = f"arrays {', '.join(f'{n}{a.shape}' for n, a in zip(names, arrays))}"

    def records(self, start: int, stop: int) -> Iterator[bytes | Skip]:
        for i in range(start, stop):
            yield _record([a[i] for a in self.arrays], self.fields, f"row {i}")

    def sample_bytes(self) -> int:
        return max(1, sum(a[0].nbytes for a in self.arrays))


class BatchSource:
    """Any dataset of batches (`__len__`, `__getitem__`: a `keras.utils.PyDataset`), cut into samples; batch b's
    samples follow batch b - 1's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, batches = dataset, len(dataset)
        if batches < 1:
            raise ValueError("kfast.data.pack got a dataset with no batches.")
        first = self._columns(0)
        self.batch_size = len(first[2][0])
        self.count = self.batch_size * (batches - 1) + len(self._columns(batches - 1)[2][0])
        self.structure, names, columns = first
        self.fields = _array_fields([c[0] for c in columns], names, "batch 0 with")
        self.classes, self.description = None, f"{type(dataset).__name__} of {batches} batches"

    def _columns(self, index: int) -> tuple[str, list[str], list[np.ndarray]]:
        batch = self.dataset[index]
        if isinstance(batch, dict):
            return "dict", [str(k) for k in batch], [np.asarray(v) for v in batch.values()]
        if isinstance(batch, (tuple, list)) and len(batch) in (1, 2):
            if any(isinstance(v, (dict, tuple, list)) for v in batch):
                raise ValueError(f"kfast.data.pack got batch {index} with nested inputs or targets; it packs batches "
                                 "of x, (x, y) or {name: array}. Flatten them into a dict of arrays first.")
            return ("xy", ["x", "y"], [np.asarray(v) for v in batch]) if len(batch) == 2 else \
                ("x", ["x"], [np.asarray(batch[0])])
        return "x", ["x"], [np.asarray(batch)]

    def records(self, start: int, stop: int) -> Iterator[bytes | Skip]:
        size = self.batch_size
        for b in range(start // size, -(-stop // size)):
            _, _, columns = self._columns(b)
            for j in range(len(columns[0])):
                i = b * size + j
                if start <= i < stop:
                    yield _record([c[j] for c in columns], self.fields, f"batch {b} sample {j}")

    def sample_bytes(self) -> int:
        return max(1, sum(np.dtype(f.dtype).itemsize * int(np.prod(f.shape)) for f in self.fields))


def source_of(data: Any) -> FolderSource | ArraySource | BatchSource:
    """The source `data` describes (see `kfast.data.pack`)."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.isdir(path):
            raise ValueError(f"kfast.data.pack got {path!r}, which is not a folder; give a folder with one sub-folder "
                             "of images per class, arrays, or a dataset of batches.")
        return FolderSource(path)
    if isinstance(data, (np.ndarray, dict)) or (isinstance(data, (tuple, list)) and len(data) == 2
                                                and all(hasattr(a, "shape") for a in data)):
        return ArraySource(data)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return BatchSource(data)
    raise ValueError(f"kfast.data.pack got {type(data).__name__}; it packs a folder of class folders, arrays (x, "
                     "(x, y) or {name: array}) or a dataset of batches (a keras.utils.PyDataset).")
