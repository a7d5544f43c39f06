"""kfast._core.topology: the single-process default, an engine's topology read by everyone, and the check
on what an engine hands over."""

import pytest

import kfast

from kfast._core import topology
from kfast.distributed import collectives


class _ThirdOfFour:
    def rank(self):
        return 2

    def size(self):
        return 4

    def local_rank(self):
        return 0

    def local_size(self):
        return 2


@pytest.fixture
def engine():
    """Sets a four-rank topology for one test, as an engine's init() would, and puts the default back."""
    topology.set_current(_ThirdOfFour())
    yield
    topology.set_current(None)


def test_one_process_is_rank_0_of_1_until_an_engine_starts():
    assert topology.current() is topology.SINGLE_PROCESS
    assert (topology.rank(), topology.size(), topology.local_rank(), topology.local_size()) == (0, 1, 0, 1)
    assert topology.is_chief() and not topology.is_initialized()


def test_every_reader_sees_the_engines_topology(engine):
    assert (topology.rank(), topology.size(), topology.local_rank(), topology.local_size()) == (2, 4, 0, 2)
    assert topology.is_initialized() and not topology.is_chief()
    # kfast.distributed answers from the same owner (no second copy of rank and size to fall out of step).
    answers = (collectives.rank(), collectives.size(), collectives.local_rank(), collectives.is_chief())
    assert answers == (2, 4, 0, False)
    assert collectives.is_initialized() and kfast.distributed.is_initialized is topology.is_initialized


def test_init_that_finds_one_process_is_initialized_as_one_process(monkeypatch):
    # One answer for "did init() run", kept by the topology, whichever engine (or none) init() found.
    monkeypatch.setattr(topology, "_current", None)  # put back as it was after the test
    monkeypatch.setattr(collectives, "_keras_backend", lambda: "torch")
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not kfast.distributed.is_initialized()
    with pytest.warns(UserWarning, match="running as a single process"):
        kfast.distributed.init()
    assert kfast.distributed.is_initialized() and topology.is_initialized()
    assert topology.current() is topology.SINGLE_PROCESS and kfast.distributed.size() == 1
    topology.set_current(None)
    assert not kfast.distributed.is_initialized()


def test_an_engine_hands_over_something_with_the_four_methods():
    with pytest.raises(TypeError, match=r"set_current got 4; it needs an object with rank\(\), size\(\), "):
        topology.set_current(4)
    assert topology.current() is topology.SINGLE_PROCESS
