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
