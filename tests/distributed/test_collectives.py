"""The router (kfast.distributed.collectives) in one process: the identity collectives, the root check, and
the preemption vote alone (two engines' worth of it: test_horovod_collectives.py, test_jax_engine.py)."""

import signal

import pytest

import kfast
from kfast._core import topology
from kfast.distributed import collectives
from kfast.distributed.preemption import PreemptionWatch

pytestmark = pytest.mark.single_process


class _FourRanks(topology.SingleProcess):
    def size(self):
        return 4


def test_the_public_names_are_the_routers_and_is_initialized_is_the_topologys():
    for name in ("init", "rank", "size", "broadcast_object", "allgather_object", "allreduce_sum_values", "verbose"):
        assert getattr(kfast.distributed, name) is getattr(collectives, name)
    assert kfast.distributed.is_initialized is topology.is_initialized


def test_one_process_has_identity_collectives():
    assert collectives.allreduce_max_ints([3, -1]) == [3, -1]
    assert collectives.broadcast_object({"a": 1}) == {"a": 1} and collectives.allgather_object(7) == [7]
    assert collectives.allreduce_sum_values([0.5]) == [0.5]


def test_a_root_that_is_no_rank_is_an_error_not_a_wait(monkeypatch):
    monkeypatch.setattr(topology, "_current", _FourRanks())
    with pytest.raises(ValueError, match=r"^broadcast_object got root_rank=4; this job's ranks are 0 to 3\.$"):
        collectives.broadcast_object(None, root_rank=4)
    with pytest.raises(ValueError, match=r"^broadcast_variables got root_rank=-1; this job's ranks are 0 to 3\.$"):
        collectives.broadcast_variables([], root_rank=-1)


def test_alone_the_vote_takes_no_collective_and_names_this_processs_signal():
    watch = PreemptionWatch((signal.SIGTERM,), 60, lambda: None, "")
    watch.start()
    try:
        assert watch.agree() is None
        watch._noted(signal.SIGTERM)  # what signal_handling calls as SIGTERM arrives
        assert watch.agree() == "SIGTERM"
    finally:
        watch.stop(redeliver=False)
