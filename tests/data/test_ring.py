"""The shared-memory ring's slots: lent, exported, given back when the batch is freed."""

import signal
import sys

import pytest

from kfast.data._workers.ring import Ring

LAYOUT = [("float32", (4,), 0)]


@pytest.fixture
def ring():
    ring = Ring(2, 64)
    yield ring
    ring.release()


def test_a_slot_comes_back_when_the_last_view_of_its_batch_is_freed(ring):
    slot = ring.acquire()
    (leaf,) = ring.export(slot, LAYOUT)
    view = leaf[1:]
    del leaf
    other = ring.acquire()
    assert ring.acquire() == -1  # the batch's view still holds `slot`
    del view
    assert ring.acquire() == slot
    ring.give_back(other)
    assert ring.acquire() == other


def test_a_ctrl_c_while_a_batch_is_freed_reaches_the_training_loop(ring):
    # CI saw a Ctrl-C land inside the Python callback that gave a freed batch's slot back: Python printed
    # "Exception ignored" and fit went on. The profile hook raises SIGINT at the first Python-level event
    # after the batch is dropped, which was that callback's frame.
    slot = ring.acquire()
    (leaf,) = ring.export(slot, LAYOUT)
    entered = []

    def hook(frame, event, arg):
        if not entered:
            entered.append(frame.f_code.co_name)
            signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sys.setprofile(hook)
            try:
                del leaf
                for _ in range(100_000):  # a loop checks for pending signals at each turn
                    pass
            finally:
                sys.setprofile(None)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert entered and entered[0] != "_give_back"
    assert sorted([ring.acquire(), ring.acquire()]) == [0, 1]  # and the batch's slot came back
