"""Flatten a batch (array, tuple/list or dict of arrays, nested as Keras allows) into a structure
description and a list of leaves, and rebuild it. Workers send the description and the leaves' bytes;
the loader compares descriptions to catch datasets whose batches change structure."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
import importlib
import sys
import warnings
from typing import Any

import numpy as np

# How a batch nests: None for a leaf, else (kind, children) with kind "dict" (children: (key, spec) pairs),
# "list" or "tuple" (children: specs), or a namedtuple's `(module, qualified name)` (children: specs of its
# fields). A namedtuple goes by name, so a spec pickles wherever the class lives, and comes back as that
# class where it is rebuilt (the training process, which has it).
Spec = tuple[str | tuple[str, str], tuple[Any, ...]] | None
# What `signature` returns: the nesting, and (dtype string, rank) per leaf.
Signature = tuple[Spec, tuple[tuple[str, int], ...]]


def flatten(batch: Any) -> tuple[Spec, list[Any]]:
    """Returns `(spec, leaves)`: a hashable description of the nesting and the leaves in order."""
    leaves: list[Any] = []
    return _walk(batch, leaves), leaves


# Module-level recursion, not nested closures: a recursive closure is a reference cycle that would keep
# the leaves alive until the garbage collector runs, and the loader reuses arrays nobody references.
def _walk(node: Any, leaves: list[Any]) -> Spec:
    if isinstance(node, dict):
        # Keys in a fixed order: Keras matches dict batches by key, so insertion order must not matter.
        return ("dict", tuple((key, _walk(node[key], leaves)) for key in sorted(node, key=str)))
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):
        cls = type(node)
        return ((cls.__module__, cls.__qualname__), tuple(_walk(n, leaves) for n in node))
    if isinstance(node, (tuple, list)):
        return ("list" if isinstance(node, list) else "tuple", tuple(_walk(n, leaves) for n in node))
    leaves.append(node)
    return None


def samples(leaves: Sequence[Any]) -> int:
    """Samples in a batch whose leaves are `leaves`: the first leaf's first dimension (1 for scalars)."""
    return int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else 1


def batch_size(batch: Any) -> int:
    """Samples in `batch`: the first dimension of its first leaf, in `flatten`'s order (1 for scalars)."""
    return samples(flatten(batch)[1])


def unflatten(spec: Spec, leaves: Iterable[Any]) -> Any:
    """Inverse of `flatten`."""
    return _build(spec, iter(leaves))


def _build(node: Spec, leaves: Iterator[Any]) -> Any:
    if node is None:
        return next(leaves)
    kind, children = node
    if kind == "dict":
        return {key: _build(child, leaves) for key, child in children}
    items = [_build(child, leaves) for child in children]
    if isinstance(kind, tuple):
        return _named(kind)(*items)
    return items if kind == "list" else tuple(items)


_classes: dict[tuple[str, str], Any] = {}


def _named(name: tuple[str, str]) -> Any:
    """The namedtuple class `(module, qualified name)`; `tuple` with a warning, once, when this process
    cannot find it (a class defined inside a function, say)."""
    if name not in _classes:
        module, qualname = name
        found: Any = sys.modules.get(module)
        try:
            if found is None:
                found = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            warnings.warn(f"FastLoader cannot find the namedtuple class {module}.{qualname} of its batches in "
                          "this process, so they come back as plain tuples; define the class at the top level "
                          "of a module or of the script.", stacklevel=4)
            found = None
        _classes[name] = found if isinstance(found, type) else _plain_tuple
    return _classes[name]


def _plain_tuple(*items: Any) -> tuple[Any, ...]:
    return tuple(items)


def signature(batch: Any, flat: tuple[Spec, list[Any]] | None = None) -> Signature:
    """Describes what must stay the same across batches: nesting, and each leaf's dtype and rank.

    `flat` is `flatten(batch)` when the caller has it already."""
    spec, leaves = flat or flatten(batch)
    return spec, tuple((np.asarray(leaf).dtype.str, np.ndim(leaf)) for leaf in leaves)


def describe(sig: Signature) -> str:
    """Readable form of a `signature`, for error messages."""
    spec, leaves = sig
    return f"structure {_spec_text(spec)} with leaves {', '.join(f'{dt}[rank {nd}]' for dt, nd in leaves)}"


def _spec_text(node: Spec) -> str:
    if node is None:
        return "array"
    kind, children = node
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_spec_text(c)}" for k, c in children) + "}"
    inner = ", ".join(_spec_text(c) for c in children)
    if isinstance(kind, tuple):
        return f"{kind[1]}({inner})"
    return f"[{inner}]" if kind == "list" else f"({inner})"


def shm_layout(leaves: Iterable[Any], align: int = 64) -> tuple[list[tuple[str, tuple[int, ...], int]] | None, int]:
    """Plans how numeric array leaves sit in one shared-memory slot.

    Returns:
        `(layout, nbytes)` where layout lists `(dtype_str, shape, offset)` per leaf, or `(None, 0)` when a
        leaf is not a plain numeric numpy array (such batches travel pickled instead).
    """
    layout: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0
    for leaf in leaves:
        if not isinstance(leaf, np.ndarray) or leaf.dtype.kind not in "biufc" or leaf.dtype.hasobject:
            return None, 0
        layout.append((leaf.dtype.str, leaf.shape, offset))
        offset += -(-leaf.nbytes // align) * align
    return layout, offset
