"""PackedDataset: a Keras `PyDataset` over a pack (`kfast pack`), for datasets of millions of samples."""

from __future__ import annotations

import sys
from typing import Any

from kfast._core import topology
from kfast._core.checks import check_int
from kfast.data._loader_args import default_seed
from kfast.data._worker_form_dataset import WorkerFormDataset
from kfast.data.packed import layout
from kfast.data.packed.reader import PackedBatches
from kfast.data.packed.stores import open_store

_NAMED = 5  # bad records a warning names; the rest are counted


class PackedDataset(WorkerFormDataset):
    """The batches of a pack (a folder or `s3://bucket/prefix` that `kfast pack` wrote), read by global sample
    index in FastLoader's workers.

    Nothing before the first batch costs time per sample: the pack's metadata is one small file. Training data is
    shuffled over all samples: each epoch is a new permutation of every sample, computed, not stored (a few
    integers, at any size), keyed by `seed` and the epoch FastLoader gives `set_epoch`. FastLoader deals the
    batches to ranks (batch r, r + R, ... to rank r of R), so each sample goes to another rank each epoch, and
    every rank gets as many batches: per epoch the last `len % R` batches, and with `drop_remainder` the last
    `samples % batch_size` samples, are left out, other ones each epoch. A checkpoint of the loader
    (`RankZeroCheckpoint(loader=...)`) saves `seed` with the loader's position, so a resumed epoch, on any
    number of ranks, reads exactly the batches not yet trained.

    `shuffle_window=W` reads W shards at a time instead (whole shards in a random order, the samples of each W
    mixed): what object storage needs, where a permutation of all samples would fetch every shard for every
    batch. A bad record (a shard damaged after packing, an image that does not decode) raises a `ValueError`
    naming its shard, record and sample index; with `on_bad_record="skip"` it is left out of its batch (one
    sample shorter), counted in `bad_records`, named in a warning (the first five), and past `max_bad_records`
    an error stops the run.

    Args:
        path: the pack's folder, or `s3://bucket/prefix`.
        batch_size: samples per batch. Defaults to `32`.
        shuffle: a new permutation of all samples each epoch; else index order. Defaults to `True`.
        seed: the permutation's seed, an int >= 0, the same on every rank. Defaults to `None`: drawn from
            Python's `random` (which `keras.utils.set_random_seed` sets); give one when several ranks read.
        shuffle_window: `None` for a permutation of all samples, or W to read W shards at a time. Defaults to
            `None`.
        image_size: `(height, width)` to resize image fields to. Defaults to `None`: as packed.
        drop_remainder: leave out the last, partial batch. Defaults to `None`: when shuffled.
        validation_split: the fraction of samples held out for validation, as Keras's
            `image_dataset_from_directory` has it: with `subset`, and a `seed`, the same for both. Defaults to
            `None`: every sample.
        subset: `"training"` or `"validation"`, with `validation_split`. Defaults to `None`.
        on_bad_record: `"raise"` or `"skip"`. Defaults to `"raise"`.
        max_bad_records: with `"skip"`, the most bad records a run goes on past. Defaults to `100`.
        cache_dir: the local cache of an `s3://` pack. Defaults to `None`: `~/.cache/kfast/shards/`.
        cache_bytes: the most bytes that cache keeps. Defaults to `None`: 20 GiB.

    Raises:
        ValueError: for a path that holds no pack, bad arguments, or no seed under several ranks.

    Example:

    >>> import numpy as np, tempfile, kfast
    >>> folder = kfast.data.pack((np.arange(10.0).reshape(10, 1), np.arange(10)), tempfile.mkdtemp(), verbose=0)
    >>> data = kfast.data.PackedDataset(folder, batch_size=4, shuffle=False)
    >>> len(data), data[0][1].tolist()
    (3, [0, 1, 2, 3])
    >>> shuffled = kfast.data.PackedDataset(folder, batch_size=5, seed=1)
    >>> sorted(np.concatenate([shuffled[0][1], shuffled[1][1]]).tolist()) == list(range(10))
    True
    """

    def __init__(self, path: str, batch_size: int = 32, *, shuffle: bool = True, seed: int | None = None,
                 shuffle_window: int | None = None, image_size: tuple[int, int] | None = None,
                 drop_remainder: bool | None = None, validation_split: float | None = None,
                 subset: str | None = None, on_bad_record: str = "raise", max_bad_records: int = 100,
                 cache_dir: str | None = None, cache_bytes: int | None = None) -> None:
        super().__init__()
        check_int("PackedDataset", "batch_size", batch_size)
        check_int("PackedDataset", "seed", seed, least=0, or_none="for a seed drawn from Python's random")
        check_int("PackedDataset", "shuffle_window", shuffle_window, or_none="for a permutation of all samples")
        check_int("PackedDataset", "max_bad_records", max_bad_records, least=0)
        if on_bad_record not in ("raise", "skip"):
            raise ValueError(f"PackedDataset got on_bad_record={on_bad_record!r}; pass 'raise' or 'skip'.")
        if image_size is not None and (len(tuple(image_size)) != 2 or min(image_size) < 1):
            raise ValueError(f"PackedDataset got image_size={image_size!r}; pass (height, width), or None.")
        if (validation_split is None) != (subset is None) or subset not in (None, "training", "validation") \
                or (validation_split is not None and not 0 < validation_split < 1):
            raise ValueError(f"PackedDataset got validation_split={validation_split!r}, subset={subset!r}; pass both, a "
                             "fraction between 0 and 1 and 'training' or 'validation', or neither.")
        if validation_split is not None and (seed is None or shuffle_window is not None):
            raise ValueError("PackedDataset with validation_split needs seed=<int>, the same for both subsets (it fixes "
                             "which samples validate), and no shuffle_window (a split draws from every shard).")
        if seed is None and shuffle and topology.size() > 1:
            raise ValueError(
                f"PackedDataset is read by {topology.size()} ranks, which must share one permutation of the samples; "
                "pass seed=<int>, the same on every rank (a seed drawn on each rank could differ, and ranks would "
                "read some samples twice and others never).")
        store = open_store(path, cache_dir=cache_dir, cache_bytes=cache_bytes)
        where = f"{store.uri}/{layout.META_NAME}"
        try:
            text = store.read_text(layout.META_NAME)
        except FileNotFoundError:
            raise ValueError(f"PackedDataset found no {layout.META_NAME} in {path!r}; it reads a pack that `kfast pack "
                             "SOURCE OUTPUT` wrote (a pack stopped before its end has none: run the same command "
                             "again, it goes on).") from None
        info = layout.PackInfo.from_json(text, where)
        if info.samples < 1:
            raise ValueError(f"PackedDataset got an empty pack at {path!r}.")
        self.path, self.info = path, info
        self.on_bad_record, self.max_bad_records = on_bad_record, max_bad_records
        self.bad_records = 0
        self.bad_record_names: list[str] = []
        split = None
        if validation_split is not None:
            held = max(1, int(info.samples * validation_split))
            split = (0, held) if subset == "validation" else (held, info.samples - held)
        self._batches = PackedBatches(store, info, batch_size, shuffle, default_seed() if seed is None else seed,
                                      shuffle_window, None if image_size is None else tuple(image_size),  # type: ignore[arg-type]
                                      shuffle if drop_remainder is None else drop_remainder, on_bad_record == "skip",
                                      split)
        if len(self._batches) < 1:
            raise ValueError(f"PackedDataset got batch_size={batch_size} with drop_remainder for a pack of "
                             f"{info.samples} samples: no batch is left. Use a smaller batch_size.")

    num_samples = property(lambda self: self._batches.num_samples)
    batch_size = property(lambda self: self._batches.batch_size)
    seed = property(lambda self: self._batches.seed)
    classes = property(lambda self: list(self.info.classes) if self.info.classes is not None else None)

    def indices(self, index: int) -> list[int]:
        """The global sample indices of batch `index` in the current epoch."""
        return [int(i) for i in self._batches.indices(index)]

    def worker_dataset(self) -> PackedBatches:
        """The same batches without Keras, for FastLoader's worker processes."""
        return self._batches

    def take_skipped(self) -> list[str]:
        """Bad records left out in this process since the last call (thread workers read through this object)."""
        return self._batches.take_skipped()

    def add_skipped(self, records: list[str]) -> None:
        """Counts bad records a worker left out (FastLoader calls it); warns naming the first few.

        Raises:
            ValueError: when more than `max_bad_records` were left out.
        """
        before = self.bad_records
        self.bad_records += len(records)
        named = records[:max(0, _NAMED - len(self.bad_record_names))]
        self.bad_record_names.extend(named)
        for record in named:
            print(f"PackedDataset: skipped a bad record: {record}", file=sys.stderr, flush=True)
        if before < _NAMED <= self.bad_records:
            print(f"PackedDataset: {self.bad_records} bad record(s) skipped so far; the rest are counted, not named "
                  "(`bad_records`).", file=sys.stderr, flush=True)
        if self.bad_records > self.max_bad_records:
            raise ValueError(
                f"PackedDataset skipped {self.bad_records} bad records, more than max_bad_records="
                f"{self.max_bad_records} (the first: {'; '.join(self.bad_record_names[:3])}). The pack or its "
                "storage is damaged: pack the source again, or raise max_bad_records.")

    def state_dict(self) -> dict[str, Any]:
        """The permutation's seed: FastLoader's `state_dict()` saves it with its position."""
        return {"seed": self._batches.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Takes the seed back from `state_dict()`'s form."""
        self._batches.seed = int(state["seed"])
        self._batches.set_epoch(self._batches.epoch)
