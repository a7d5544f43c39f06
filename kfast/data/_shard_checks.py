"""The arguments every shard takes (rank, size, mode, start, and enough batches), checked in one place for
`kfast.data.ShardedDataset` and the tf.data shard."""

from __future__ import annotations


from kfast._core.checks import check_int

MODES = ("drop", "pad", "all")


def check_shard(caller: str, rank: int, size: int, mode: str, start: int) -> None:
    """Raises ValueError for a bad `size`, `rank`, `mode` or `start`, naming `caller`.

    Example:

    >>> check_shard("ShardedDataset", 2, 2, "drop", 0)
    Traceback (most recent call last):
    ...
    ValueError: ShardedDataset got rank=2 with size=2; rank must be in [0, 2).
    """
    check_int(caller, "size", size, hint="usually kfast.distributed.size()")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"{caller} got rank={rank!r} with size={size}; rank must be in [0, {size}).")
    if mode not in MODES:
        raise ValueError(f"{caller} got mode={mode!r}; use 'drop', 'pad' (equal steps for fit) or 'all' "
                         "(every batch once, for evaluate and predict).")
    check_int(caller, "start", start, least=0, hint="batches of the epoch already trained")


def check_enough(caller: str, batches: int, size: int) -> None:
    """Raises ValueError when `batches` cannot give each of `size` ranks one."""
    if batches < size:
        raise ValueError(f"{caller}: the dataset has {batches} batches for {size} ranks; every rank needs at least "
                         "one. Use a smaller batch size or fewer ranks.")
