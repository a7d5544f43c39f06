"""What a pack holds and how one sample is laid out in a record: `kfast-pack.json` beside the shards, and the
record codec. Keras-free (worker processes import it).

A pack is a folder (or an object-storage prefix) of ArrayRecord shards, `shard-00000-of-00012.array_record` ...,
each one sample per record, and `kfast-pack.json`, written last: its presence says the pack is complete. A record
is the sample's fields in order, each prefixed by its length (8 bytes, little-endian): an `"array"` field holds
the array's bytes in C order (dtype and shape fixed per field, in the metadata), an `"image"` field an encoded
image file's bytes as they were (JPEG, PNG, ...), decoded by the reader.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import numpy as np

FORMAT, VERSION = "kfast-pack", 1
META_NAME = "kfast-pack.json"
ARRAY, IMAGE = "array", "image"
_LENGTH = struct.Struct("<Q")


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of every sample: its name, kind (`"array"` or `"image"`), and an array's dtype and shape."""

    name: str
    kind: str
    dtype: str = "uint8"
    shape: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class PackInfo:
    """A pack's metadata (`kfast-pack.json`).

    Attributes:
        fields: each sample's fields, in record order.
        structure: how a batch is returned: `"xy"` (the first field the inputs, the second the targets), `"x"`
            (one field) or `"dict"` (every field by name).
        shards: `(file name, samples)` per shard, in global index order.
        classes: class names of a folder of class folders (label i is `classes[i]`), else None.
        source: what was packed (for people reading the file).
        skipped: files of the source that could not be packed, with why (the first 100).
        skipped_count: how many could not be packed.
    """

    fields: tuple[Field, ...]
    structure: str
    shards: tuple[tuple[str, int], ...]
    classes: tuple[str, ...] | None = None
    source: str = ""
    skipped: tuple[str, ...] = ()
    skipped_count: int = 0

    @property
    def samples(self) -> int:
        """Samples in the pack."""
        return sum(count for _, count in self.shards)

    def to_json(self) -> str:
        """The text of `kfast-pack.json`."""
        value = {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self), "samples": self.samples}
        return json.dumps(value, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> PackInfo:
        """The metadata in `text`, read from `where` (named in errors).

        Raises:
            ValueError: for a file that is not a kfast pack's, or of another version.
        """
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not JSON ({e}); a pack's {META_NAME} is written by `kfast pack`.") from None
        if not isinstance(value, dict) or value.get("format") != FORMAT:
            raise ValueError(f"{where} is not a kfast pack's metadata (no \"format\": \"{FORMAT}\"); make the pack "
                             "with `kfast pack SOURCE OUTPUT`.")
        if value.get("version") != VERSION:
            raise ValueError(f"{where} is a pack of version {value.get('version')!r}; this kfast reads version "
                             f"{VERSION}. Pack the data again with this kfast.")
        fields = tuple(Field(f["name"], f["kind"], f["dtype"], tuple(f["shape"])) for f in value["fields"])
        return cls(fields, value["structure"], tuple((str(n), int(c)) for n, c in value["shards"]),
                   tuple(value["classes"]) if value.get("classes") is not None else None, value.get("source", ""),
                   tuple(value.get("skipped", ())), int(value.get("skipped_count", 0)))


def shard_name(index: int, count: int) -> str:
    """The file name of shard `index` of `count`."""
    return f"shard-{index:05d}-of-{count:05d}.array_record"


def encode(values: list[bytes]) -> bytes:
    """One record from its fields' bytes."""
    return b"".join(_LENGTH.pack(len(v)) + v for v in values)


def decode(record: bytes, fields: tuple[Field, ...]) -> list[Any]:
    """The fields of `record`: arrays as numpy arrays (read-only views of the record), images as bytes.

    Raises:
        ValueError: for a record that does not hold those fields (truncated or corrupt).
    """
    out: list[Any] = []
    at = 0
    view = memoryview(record)
    for field in fields:
        if at + 8 > len(record):
            raise ValueError(f"the record ends ({len(record)} bytes) before field {field.name!r}")
        (n,) = _LENGTH.unpack_from(record, at)
        at += 8
        if at + n > len(record):
            raise ValueError(f"field {field.name!r} says {n} bytes but the record has {len(record) - at} left")
        data = view[at:at + n]
        at += n
        if field.kind == ARRAY:
            dtype = np.dtype(field.dtype)
            if n != dtype.itemsize * int(np.prod(field.shape, dtype=np.int64)):
                raise ValueError(f"field {field.name!r} has {n} bytes, not those of a {field.dtype} array of shape "
                                 f"{field.shape}")
            out.append(np.frombuffer(data, dtype=dtype).reshape(field.shape))
        else:
            out.append(bytes(data))
    if at != len(record):
        raise ValueError(f"the record has {len(record) - at} bytes past its last field")
    return out
