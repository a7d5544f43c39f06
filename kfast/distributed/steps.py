"""Every rank must train the same number of steps per epoch: each step ends in an allreduce, so a rank
with one step more waits for the others for ever. `check_equal_steps` turns that hang into an error
before the first step, naming every rank's count."""

from __future__ import annotations

from kfast.distributed import collectives


class UnequalStepsError(ValueError):
    """The ranks' epochs have different numbers of steps, or some rank cannot say how many it has."""


def _ranks(counts: list[int | None], count: int | None) -> str:
    ranks = [str(r) for r, c in enumerate(counts) if c == count]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def check_equal_steps(steps: int | None) -> None:
    """Raises `UnequalStepsError` on every rank unless all ranks have the same, known number of steps.

    A collective: every rank calls it, with the steps per epoch `fit` will run (`params["steps"]` of a
    callback; `None` when the data does not say, as a generator or a tf.data pipeline of unknown
    cardinality). One process is always fine.

    Args:
        steps: this rank's steps per epoch, or `None`.

    Raises:
        UnequalStepsError: when the counts differ between ranks, or a rank's is unknown.

    Example:

    >>> check_equal_steps(12)  # one process: nothing to compare
    """
    counts = collectives.allgather_object(steps)
    if len(counts) == 1 or (counts[0] is not None and len(set(counts)) == 1):
        return
    if None in counts:
        raise UnequalStepsError(
            f"{_ranks(counts, None)} of {len(counts)} cannot say how many steps an epoch has (a generator, or a "
            "tf.data pipeline of unknown cardinality, with no steps_per_epoch); under Horovod every rank must "
            "take the same number, or one waits for the others for ever. Pass steps_per_epoch= to fit, or shard "
            "with kfast.data.shard(data, kfast.distributed.rank(), kfast.distributed.size()), which gives every "
            "rank the same count.")
    found = "; ".join(f"{_ranks(counts, c)}: {c}" for c in sorted(set(counts), key=lambda c: counts.index(c)))
    raise UnequalStepsError(
        f"The ranks' epochs have different numbers of steps ({found}); each step ends in an allreduce, so the "
        f"ranks with more would wait for ever. Shard with kfast.data.shard(data, kfast.distributed.rank(), "
        f"kfast.distributed.size()) (equal counts: it drops the remainder, or pads with mode='pad'), or pass "
        f"steps_per_epoch={min(counts)} to fit.")
