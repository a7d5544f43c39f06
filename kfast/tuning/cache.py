"""Where `kfast.tune` keeps its results: one JSON file per user, keyed by host and dataset signature.

The cache only saves time: an entry that fails validation is ignored (and re-measured), and a cache that
cannot be written costs a warning, never the measured result. The file carries a format version
(`{"version": 1, "entries": {key: entry}}`); a file without one is the earlier layout, whose entries are
read as they are, and a file of a newer version is ignored with a warning (and rewritten in this one).
"""

from __future__ import annotations


import contextlib
import json
import math
import numbers
import os
import socket
import threading
import warnings
from typing import Any

import numpy as np

from kfast._core.cpus import usable_cpus
from kfast.data import structure

_SETTINGS = ("workers", "use_multiprocessing", "max_queue_size", "batches_per_s")
# The layout of tune.json this kfast writes; bump it when an entry changes meaning.
VERSION = 1
_unwritable_warned: set[str] = set()  # cache paths already warned about, so a retuning loop warns once


def cache_path() -> str:
    """`$KFAST_CACHE_DIR/tune.json`, else `$XDG_CACHE_HOME/kfast/tune.json`, else `~/.cache/kfast/tune.json`."""
    root = os.environ.get("KFAST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kfast")
    return os.path.join(root, "tune.json")


def signature(dataset: Any, model: Any = None) -> str:
    """A key naming this host and the dataset's class, length and first batch's structure and shapes, and
    the model (name and parameter count) when tuning measured training steps."""
    spec, leaves = structure.flatten(dataset[0])
    shapes = [f"{np.asarray(leaf).dtype.str}{list(np.shape(leaf))}" for leaf in leaves]
    cls = type(dataset)
    key = f"{socket.gethostname()}|{cls.__module__}.{cls.__qualname__}|{len(dataset)}|{spec}|{shapes}"
    return key if model is None else f"{key}|fit:{model.name}:{model.count_params()}"


def _read(path: str, quiet: bool = False) -> dict[str, Any]:
    """The entries in the cache file at `path` ({} when absent or unreadable, with a warning for the latter)."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if "version" not in data:
            return data  # the layout before versions: entries at the top level
        if data["version"] != VERSION:
            raise ValueError(f"format version {data['version']!r}, and this kfast reads version {VERSION}")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise ValueError("its entries are not a JSON object")
        return entries
    except (FileNotFoundError, NotADirectoryError):
        # Absent, or under a path that is not a directory: `store` says so if it cannot write there.
        return {}
    except (OSError, ValueError) as e:
        if not quiet:
            warnings.warn(f"kfast ignored its tuning cache {path} ({e}); it will be rewritten.", stacklevel=3)
        return {}


def _positive_int(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def _problem(entry: object, most_workers: int) -> str | None:
    """Why `entry` is not a result `kfast.tune` could have written, or None when it is sound."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not an object"
    missing = [k for k in (*_SETTINGS, "trials") if k not in entry]
    if missing:
        return f"missing {', '.join(missing)}"
    trials = entry["trials"]
    if not isinstance(trials, list):
        return f"trials is a {type(trials).__name__}, not a list"
    for i, item in enumerate([entry, *trials]):
        where = "" if i == 0 else f"trial {i - 1}: "
        if not isinstance(item, dict) or any(k not in item for k in _SETTINGS):
            return f"{where}not an object with {', '.join(_SETTINGS)}"
        if not _positive_int(item["workers"], most_workers):
            return f"{where}workers={item['workers']!r} is not an int in 1..{most_workers}"
        if not isinstance(item["use_multiprocessing"], bool):
            return f"{where}use_multiprocessing={item['use_multiprocessing']!r} is not a bool"
        # tune tries queues of 2 and 4 batches per worker; anything far deeper was not written by it.
        if not _positive_int(item["max_queue_size"], 4 * most_workers):
            return f"{where}max_queue_size={item['max_queue_size']!r} is not an int in 1..{4 * most_workers}"
        rate = item["batches_per_s"]
        if (not isinstance(rate, numbers.Real) or isinstance(rate, bool) or not math.isfinite(rate)
                or rate <= 0):
            return f"{where}batches_per_s={rate!r} is not a finite number > 0"
    return None


def load(key: str, most_workers: int | None = None) -> dict[str, Any] | None:
    """The cached entry for `key`, or None when there is none or it is malformed (with a warning).

    Args:
        key: a `signature(dataset)`.
        most_workers: the largest worker count a sound entry may hold. Defaults to `None`: four times the
            usable CPU cores.

    Returns:
        A dict with `workers`, `use_multiprocessing`, `max_queue_size`, `batches_per_s` and `trials`, or None.
    """
    path = cache_path()
    entry = _read(path).get(key)
    if entry is None:
        return None
    problem = _problem(entry, most_workers or 4 * usable_cpus())
    if problem is not None:
        warnings.warn(f"kfast ignored a malformed entry in its tuning cache {path} ({problem}); it will measure "
                      "again and overwrite the entry.", stacklevel=3)
        return None
    return entry


def store(key: str, entry: dict[str, Any]) -> None:
    """Saves `entry` under `key`; warns once per cache path, instead of raising, when it cannot be written."""
    path = cache_path()
    # Quiet: `load` has already warned about an unreadable file (unless `force` skipped it to replace it).
    entries = _read(path, quiet=True)
    entries[key] = entry
    # Unique per process and thread, then an atomic replace: concurrent writers never leave a half-written
    # cache (the last one wins).
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"version": VERSION, "entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if path not in _unwritable_warned:
            _unwritable_warned.add(path)
            warnings.warn(f"kfast could not save its tuning result to {path} ({e}); the result is used but will "
                          "be measured again next time. Set KFAST_CACHE_DIR to a writable directory to keep it.",
                          stacklevel=3)
