"""kfast.data._workers.threads: what a wait for a batch that no worker thread has taken yet says."""

import threading
import time

import pytest

from kfast.data import WorkerError
from kfast.data._workers.threads import ThreadPool


class _HeldAtZero:
    """Batch 0 waits for `release`; the others come at once."""

    def __init__(self):
        self.release = threading.Event()

    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 0:
            self.release.wait(30)
        return [index], [index]


def test_a_batch_queued_behind_a_stuck_one_names_what_the_busy_threads_are_doing():
    dataset = _HeldAtZero()
    pool = ThreadPool(dataset, 1, timeout=1)
    try:
        pool.submit(0, 0, 0)
        pool.submit(1, 1, 0)
        with pytest.raises(WorkerError) as raised:
            pool.result(1, time.monotonic())
    finally:
        dataset.release.set()
        pool.close()
    message = str(raised.value)
    assert "batch index 1 (waiting for a free worker thread; 1 of 1 alive, 1 busy)" in message, message
    assert "on batch index 0:" in message and "in __getitem__" in message and "self.release.wait" in message, message


def test_a_wait_for_a_batch_no_thread_started_ends_with_an_error_when_the_threads_close():
    dataset = _HeldAtZero()
    pool = ThreadPool(dataset, 1)
    pool.submit(0, 0, 0)
    pool.submit(1, 1, 0)
    raised = []

    def wait():
        try:
            pool.result(1, time.monotonic())
        except WorkerError as e:
            raised.append(str(e))

    waiting = threading.Thread(target=wait)
    waiting.start()
    time.sleep(0.3)  # the wait has begun; batch 1 is queued behind the held batch 0
    threading.Timer(0.3, dataset.release.set).start()  # so that close() finds the thread free
    pool.close()
    waiting.join(10)
    assert not waiting.is_alive()
    assert raised == ["FastLoader's worker threads were closed while batch index 1 waited for one."], raised
    with pytest.raises(WorkerError, match="batch index 2 was asked of them afterwards"):
        pool.submit(2, 2, 0)
