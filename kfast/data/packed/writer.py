"""`kfast.data.pack`: a source into ArrayRecord shards and `kfast-pack.json` (see `kfast.data.packed.layout`).

Resumable: the plan (the source, its sample count, samples per shard) is written first to
`kfast-pack.progress.json`; each shard is written under a temporary name and renamed when complete, and its count
recorded in the progress file. Run again after a stop, the same call writes only the shards that are missing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from kfast._core.checks import check_int
from kfast.data.packed import layout
from kfast.data.packed.reader import _array_record
from kfast.data.packed.sources import Skip, source_of

PROGRESS_NAME = "kfast-pack.progress.json"
_SHARD_BYTES = 64 << 20  # a shard's target size: large enough for object storage, small enough to cache a few
_NAMED_SKIPS = 100


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)


def _write_shard(source: Any, output: str, index: int, count: int, size: int) -> tuple[int, list[str]]:
    start, stop = index * size, min(source.count, (index + 1) * size)
    final = os.path.join(output, layout.shard_name(index, count))
    tmp = f"{final}.tmp-{os.getpid()}"
    writer = _array_record().ArrayRecordWriter(tmp, "group_size:1,uncompressed")
    written, skipped = 0, []
    try:
        for record in source.records(start, stop):
            if isinstance(record, Skip):
                skipped.append(record.why)
                continue
            writer.write(record)
            written += 1
    except BaseException:
        writer.close()
        os.unlink(tmp)
        raise
    writer.close()
    os.replace(tmp, final)
    return written, skipped


def pack(data: Any, output: str, *, shard_size: int | None = None, workers: int | None = None,
         verbose: int = 1) -> str:
    """Packs `data` into `output`: ArrayRecord shards of one sample per record and `kfast-pack.json`, which
    `kfast.data.PackedDataset` (and Grain's `ArrayRecordDataSource`, shard by shard) reads.

    `data` is a folder with one sub-folder of images per class (the files' bytes are packed as they are and
    decoded when read; a file that does not open is left out and named in the metadata), arrays (`x`, `(x, y)`
    or `{name: array}`, one sample per row), or any dataset of batches (a `keras.utils.PyDataset`). Shards are
    written in parallel threads, with a progress bar; a pack stopped midway goes on where it stopped when run
    again with the same arguments.

    Args:
        data: what to pack.
        output: the pack's folder (made if missing).
        shard_size: samples per shard. Defaults to `None`: about 64 MiB of samples per shard.
        workers: threads writing shards. Defaults to `None`: one per CPU core, at most 8.
        verbose: 1 for a progress bar, 0 for none. Defaults to `1`.

    Returns:
        `output`.

    Raises:
        ValueError: for data it cannot pack, or an `output` holding another pack in progress.

    Example:

    >>> import numpy as np, tempfile, kfast
    >>> folder = kfast.data.pack((np.zeros((100, 3), "float32"), np.arange(100)), tempfile.mkdtemp(), verbose=0)
    >>> kfast.data.PackedDataset(folder, batch_size=10, shuffle=False).num_samples
    100
    """
    check_int("pack", "shard_size", shard_size, or_none="for about 64 MiB per shard")
    check_int("pack", "workers", workers, or_none="for one per CPU core")
    source = source_of(data)
    size = shard_size or max(1, min(source.count, _SHARD_BYTES // source.sample_bytes()))
    count = -(-source.count // size)
    os.makedirs(output, exist_ok=True)
    plan = {"source": source.description, "samples": source.count, "shard_size": size,
            "fields": [dataclasses.asdict(f) for f in source.fields]}
    meta_path, progress_path = os.path.join(output, layout.META_NAME), os.path.join(output, PROGRESS_NAME)
    if os.path.exists(meta_path):
        raise ValueError(f"kfast.data.pack: {output!r} holds a finished pack already ({layout.META_NAME}); pack into "
                         "another folder, or delete it first.")
    done: dict[str, Any] = {}
    if os.path.exists(progress_path):
        with open(progress_path, encoding="utf-8") as f:
            progress = json.load(f)
        if progress.get("plan") != json.loads(json.dumps(plan)):
            raise ValueError(f"kfast.data.pack: {output!r} holds a pack in progress of another source or shard size "
                             f"({progress.get('plan', {}).get('source')!r}, {progress.get('plan', {}).get('shard_size')} "
                             "samples per shard); pack into another folder, or delete it to start over.")
        done = {k: v for k, v in progress["shards"].items()
                if os.path.exists(os.path.join(output, layout.shard_name(int(k), count)))}
    todo = [i for i in range(count) if str(i) not in done]
    lock = threading.Lock()
    bar = _progress(source.count, verbose)
    bar.update(sum(min(size, source.count - int(k) * size) for k in done))
    _write_json(progress_path, {"plan": plan, "shards": done})
    with ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
        futures = {pool.submit(_write_shard, source, output, i, count, size): i for i in todo}
        for future in as_completed(futures):
            i = futures[future]
            written, skipped = future.result()
            with lock:
                done[str(i)] = {"samples": written, "skipped": skipped}
                _write_json(progress_path, {"plan": plan, "shards": done})
            bar.update(min(size, source.count - i * size))
    skipped = [why for i in range(count) for why in done[str(i)]["skipped"]]
    info = layout.PackInfo(source.fields, source.structure,
                           tuple((layout.shard_name(i, count), done[str(i)]["samples"]) for i in range(count)),
                           source.classes, source.description, tuple(skipped[:_NAMED_SKIPS]), len(skipped))
    with open(meta_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(info.to_json())
    os.replace(meta_path + ".tmp", meta_path)
    os.unlink(progress_path)
    if skipped and verbose:
        print(f"kfast pack: left out {len(skipped)} file(s) that do not open: {'; '.join(skipped[:3])}"
              f"{'; ...' if len(skipped) > 3 else ''} (all named in {meta_path}).", flush=True)
    return output


class _Quiet:
    def update(self, n: int) -> None:
        pass


class _Bar:
    def __init__(self, total: int) -> None:
        import keras  # Keras's own progress bar, as fit's

        self._bar, self._done = keras.utils.Progbar(total, unit_name="sample"), 0

    def update(self, n: int) -> None:
        self._done += n
        self._bar.update(self._done)


def _progress(total: int, verbose: int) -> _Quiet | _Bar:
    return _Bar(total) if verbose else _Quiet()
