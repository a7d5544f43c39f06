"""kfast._core.topology: the single-process default, an engine's topology read by everyone, and the check
on what an engine hands over."""

import pytest

from kfast._core import topology
from kfast.distributed import _horovod


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
    assert (_horovod.rank(), _horovod.size(), _horovod.local_rank(), _horovod.is_chief()) == (2, 4, 0, False)


def test_an_engine_hands_over_something_with_the_four_methods():
    with pytest.raises(TypeError, match=r"set_current got 4; it needs an object with rank\(\), size\(\), "):
        topology.set_current(4)
    assert topology.current() is topology.SINGLE_PROCESS
