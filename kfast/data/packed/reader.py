"""PackedBatches: the batches of a pack, read by global sample index, for FastLoader's workers. Keras-free.

Batch b of epoch e holds the samples at positions b * B ... (b + 1) * B - 1 of the epoch's order, a permutation
of every sample of the pack keyed by (seed, e) (see `kfast.data.packed.index_shuffle`): every sample once per
epoch, in another batch each epoch. FastLoader deals the batches to ranks, so a sample moves between ranks from
one epoch to the next, and a resumed epoch (on any number of ranks) reads the batches it had not read.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import numpy as np

from kfast.data.packed import layout
from kfast.data.packed.index_shuffle import BlockShuffle, IndexShuffle
from kfast.data.packed.stores import LocalStore, ShardStore

_OPEN_SHARDS = 64  # readers kept open per process (one file descriptor each)
_AHEAD_BATCHES = 8  # batches whose shards a remote store fetches ahead


def _array_record() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError:
        raise ImportError("Packed data is stored as ArrayRecord shards; install it with `pip install "
                          "'kfast[packed]'` (the array-record package).") from None
    return array_record_module


class BadRecord(ValueError):
    """A record that cannot be read or decoded; the message names its shard, record and sample index."""


class PackedBatches:
    """The batches of pack `info` in `store` (see the module's docstring); the keras-free half of `PackedDataset`.

    Args:
        store: where the shards are.
        info: the pack's metadata.
        batch_size: samples per batch.
        shuffle: a new permutation of all samples each epoch (`set_epoch`), else index order.
        seed: the permutation's seed.
        shuffle_window: `None` for a permutation of all samples; an int W to read W shards at a time (blocks of
            whole shards in a random order, samples mixed within each W).
        image_size: `(height, width)` that image fields are resized to, or None to keep their size.
        drop_remainder: leave out the last, partial batch.
        skip_bad_records: leave a bad record out of its batch (`take_skipped` reports it) instead of raising.
        subset: `(first, count)`: read only positions first .. first + count - 1 of a fixed permutation of the
            pack keyed by `seed` (a validation split), or None for every sample.
    """

    def __init__(self, store: ShardStore, info: layout.PackInfo, batch_size: int, shuffle: bool, seed: int,
                 shuffle_window: int | None, image_size: tuple[int, int] | None, drop_remainder: bool,
                 skip_bad_records: bool, subset: tuple[int, int] | None = None) -> None:
        self.store, self.info, self.batch_size = store, info, batch_size
        self.shuffle, self.seed, self.shuffle_window = shuffle, seed, shuffle_window
        self.image_size, self.drop_remainder, self.skip_bad_records = image_size, drop_remainder, skip_bad_records
        counts = np.array([count for _, count in info.shards], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts  # the global index of each shard's first record
        self.num_samples = int(self._ends[-1]) if len(counts) else 0
        self._subset = None
        if subset is not None:
            self._subset = (subset[0], IndexShuffle(self.num_samples, seed, epoch=0, salt=1))
            self.num_samples = subset[1]
        self.epoch = 0
        self._order: Any = None
        self._readers: OrderedDict[int, Any] = OrderedDict()
        self._skipped: list[str] = []
        self.set_epoch(0)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"], state["_skipped"] = OrderedDict(), []  # open files stay in the process that opened them
        return state

    def set_epoch(self, epoch: int) -> None:
        """Selects epoch `epoch`'s order of the samples."""
        self.epoch = epoch
        if not self.shuffle:
            self._order = None
        elif self.shuffle_window is None:
            self._order = IndexShuffle(self.num_samples, self.seed, epoch)
        else:
            sizes = [count for _, count in self.info.shards]
            self._order = BlockShuffle(sizes, self.shuffle_window, self.seed, epoch)

    def __len__(self) -> int:
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_remainder else -(-n // b)

    def indices(self, index: int) -> np.ndarray:
        """The global sample indices of batch `index` of the current epoch."""
        if not 0 <= index < len(self):
            raise IndexError(f"PackedDataset batch index {index} is out of range for {len(self)} batches.")
        positions = np.arange(index * self.batch_size, min(self.num_samples, (index + 1) * self.batch_size))
        picks = positions if self._order is None else self._order(positions)
        if self._subset is not None:
            first, split = self._subset
            picks = split(first + picks)  # the same split whatever the epoch: a fixed permutation
        return picks

    def __getitem__(self, index: int) -> Any:
        picks = self.indices(index)
        self._fetch_ahead(index)
        samples = self._read(picks)
        if not samples:
            raise BadRecord(f"every sample of batch {index} ({len(picks)} records) is bad; the reports above name "
                            "them. Pack the source again (`kfast pack`) or check the shards' storage.")
        return self._collate(samples)

    def take_skipped(self) -> list[str]:
        """The bad records left out since the last call (FastLoader hands them to the dataset's `add_skipped`)."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def _fetch_ahead(self, index: int) -> None:
        # A global permutation reads every shard in every batch: there is nothing to fetch ahead of it.
        if isinstance(self.store, LocalStore) or (self.shuffle and self.shuffle_window is None):
            return
        ahead = range(index + 1, min(len(self), index + 1 + _AHEAD_BATCHES))
        if ahead:
            picks = np.concatenate([self.indices(i) for i in ahead])
            shards = np.unique(np.searchsorted(self._ends, picks, side="right"))
            self.store.prefetch([self.info.shards[int(s)][0] for s in shards])

    def _reader(self, shard: int) -> Any:
        reader = self._readers.pop(shard, None)
        if reader is None:
            name = self.info.shards[shard][0]
            path = self.store.local_path(name)
            reader = _array_record().ArrayRecordReader(path, "readahead_buffer_size:0")
            while len(self._readers) >= _OPEN_SHARDS:
                self._readers.popitem(last=False)[1].close()
        self._readers[shard] = reader  # most recently used last
        return reader

    def _where(self, shard: int, record: int, index: int) -> str:
        return f"{self.store.uri}/{self.info.shards[shard][0]} record {record} (sample {index})"

    def _read(self, picks: np.ndarray) -> list[list[Any]]:
        shards = np.searchsorted(self._ends, picks, side="right")
        starts = self._starts
        records: list[Any] = [None] * len(picks)
        for shard in np.unique(shards):
            at = np.flatnonzero(shards == shard)
            offsets = [int(o) for o in picks[at] - starts[shard]]
            reader = self._reader(int(shard))  # storage errors (credentials, network) are not bad records: raised
            try:
                got = reader.read(offsets)
            except Exception:  # noqa: BLE001 - one record at a time, to name the bad one
                got = [self._one(reader, int(shard), o, int(picks[i])) for i, o in zip(at, offsets)]
            for j, record in zip(at, got):
                records[int(j)] = record
        samples = []
        for i, record in enumerate(records):
            at_shard = int(shards[i])
            try:
                if isinstance(record, BadRecord):
                    raise record
                samples.append(self._decode(record))
            except Exception as e:  # noqa: BLE001 - any failure makes the record unusable
                where = self._where(at_shard, int(picks[i] - starts[at_shard]), int(picks[i]))
                why = str(e) if isinstance(e, BadRecord) else f"{where}: {type(e).__name__}: {e}"
                if not self.skip_bad_records:
                    raise BadRecord(f"{why}. Pass on_bad_record='skip' to PackedDataset to train without bad "
                                    "records (each one counted and reported), or pack the source again.") from e
                self._skipped.append(why)
        return samples

    def _one(self, reader: Any, shard: int, offset: int, index: int) -> Any:
        try:
            return reader.read([offset])[0]
        except Exception as e:  # noqa: BLE001 - reported as a bad record
            return BadRecord(f"{self._where(shard, offset, index)}: {type(e).__name__}: {e}")

    def _decode(self, record: bytes) -> list[Any]:
        values = layout.decode(record, self.info.fields)
        for i, field in enumerate(self.info.fields):
            if field.kind == layout.IMAGE:
                values[i] = self._image(values[i])
        return values

    def _image(self, data: bytes) -> np.ndarray:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("RGB")
            if self.image_size is not None and img.size != (self.image_size[1], self.image_size[0]):
                img = img.resize((self.image_size[1], self.image_size[0]), Image.Resampling.BILINEAR)
            return np.asarray(img, dtype=np.uint8)

    def _collate(self, samples: list[list[Any]]) -> Any:
        columns = []
        for i, field in enumerate(self.info.fields):
            try:
                columns.append(np.stack([s[i] for s in samples]))
            except ValueError:
                shapes = sorted({s[i].shape for s in samples})
                raise ValueError(f"the {field.name!r} fields of one batch have shapes {shapes[:4]}; give "
                                 "PackedDataset image_size=(height, width) to resize images to one size.") from None
        if self.info.structure == "xy":
            return columns[0], columns[1]
        if self.info.structure == "x":
            return columns[0]
        return {field.name: column for field, column in zip(self.info.fields, columns)}
