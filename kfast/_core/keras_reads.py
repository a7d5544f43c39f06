"""What Keras's loops read from FastLoaders under Horovod, told to the callbacks that keep the numbers right.

A FastLoader reads every batch on every rank unless it is training data (`FastLoader(training=True)`), so
`evaluate`, `predict` and `fit`'s validation give one process's results on each rank. Two callbacks need to
know what was read, and Keras tells a callback nothing about the data:

- `MetricAverage` sums the metric states over the ranks after an evaluation; over data every rank read whole,
  the sum would count each sample once per rank (a `TruePositives` would come out `size` times too large), so
  it sums only when no whole-set FastLoader was read since the evaluation began.
- `BroadcastState` checks that `fit` trains on training data: a whole-set loader trained on would give every
  rank every batch. It also opens a window while `fit` trains (`training_window`), outside which a training
  loader read by Keras warns that its results are one rank's part; a `fit` ended by an exception can leave the
  window open, which costs that warning only, never an error.

The loader counts, here, each Keras epoch it begins over the whole set with several ranks (`count_whole_read`,
from its data adapter's `on_epoch_begin`, which Keras calls inside the loop it runs); a callback compares the
count at two of its own hooks. Counts only grow, so a loop that ended by an exception leaves nothing stale.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_whole_reads = 0
_training = False


def count_whole_read() -> None:
    """Says that Keras began an epoch over a FastLoader that every rank reads whole."""
    global _whole_reads
    with _lock:
        _whole_reads += 1


def whole_reads() -> int:
    """The number of such epochs begun in this process so far.

    Example:

    >>> before = whole_reads(); count_whole_read(); whole_reads() - before
    1
    """
    return _whole_reads


def training_window(open_: bool) -> None:
    """Opens (`fit`'s training part of an epoch began) or closes the window in which training loaders are read."""
    global _training
    _training = open_


def in_training_window() -> bool:
    """Whether `fit` is training, as far as `BroadcastState` said."""
    return _training
