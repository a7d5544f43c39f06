"""Where `kfast.tune` keeps its results: one JSON file per user, keyed by host and dataset signature."""

import json
import os
import socket
import warnings

import numpy as np

from kfast.data import structure


def cache_path():
    """`$KFAST_CACHE_DIR/tune.json`, else `$XDG_CACHE_HOME/kfast/tune.json`, else `~/.cache/kfast/tune.json`."""
    root = os.environ.get("KFAST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kfast")
    return os.path.join(root, "tune.json")


def signature(dataset):
    """A key naming this host and the dataset's class, length and first batch's structure and shapes."""
    spec, leaves = structure.flatten(dataset[0])
    shapes = [f"{np.asarray(leaf).dtype.str}{list(np.shape(leaf))}" for leaf in leaves]
    cls = type(dataset)
    return f"{socket.gethostname()}|{cls.__module__}.{cls.__qualname__}|{len(dataset)}|{spec}|{shapes}"


def _read(path):
    try:
        with open(path) as f:
            entries = json.load(f)
        if not isinstance(entries, dict):
            raise ValueError("not a JSON object")
        return entries
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"kfast ignored its tuning cache {path} ({e}); it will be rewritten.", stacklevel=3)
        return {}


def load(key):
    return _read(cache_path()).get(key)


def store(key, entry):
    path = cache_path()
    entries = _read(path)
    entries[key] = entry
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(entries, f, indent=1)
    os.replace(tmp, path)
