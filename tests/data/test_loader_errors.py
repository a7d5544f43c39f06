"""After an error a FastLoader's iteration goes on to the next batch, as PyTorch's DataLoader's does, so no loop
over it can be endless; an iteration dropped midway ends its workers at once (issue 48, item 5)."""

import gc
import threading

import psutil

import pytest

from kfast.data import FastLoader
import datasets

MODES = [pytest.param(False, id="threads"), pytest.param(True, id="processes")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_pytorchs_test_error_loop_ends(use_multiprocessing):
    # PyTorch's test_error: count the errors, stop at StopIteration. Each batch raises once, then the epoch ends.
    with FastLoader(datasets.AllFailing(n=6), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        it, errors = iter(loader), 0
        for _ in range(100):  # bound: an endless loop would fail here, not hang
            try:
                next(it)
            except NotImplementedError:
                errors += 1
            except StopIteration:
                break
        assert errors == 6


@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_loop_that_skips_bad_batches_gets_every_other_one_in_order(use_multiprocessing):
    with FastLoader(datasets.SomeFailing(n=8), workers=2, use_multiprocessing=use_multiprocessing) as loader:
        it, got, failed = iter(loader), [], []
        for _ in range(20):
            try:
                got.append(int(next(it)[1][0, 0]))
            except ValueError as e:
                failed.append(str(e))
            except StopIteration:
                break
        assert got == [0, 1, 3, 4, 6, 7] and len(failed) == 2 and "batch 2" in failed[0]
        assert loader.state_dict()["epoch"] == 1  # the epoch is over: the next loop is a new one


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("kfast-loader-")]


@pytest.mark.timeout(60)
def test_a_dropped_iteration_ends_its_threads_at_once():
    # PyTorch's test_partial_workers: 4 workers, take a few batches, drop the iterator, the workers end.
    before = set(_loader_threads())  # other tests' loaders may still be collected later
    loader = FastLoader(datasets.Squares(n=40), workers=4, use_multiprocessing=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
    threads = [t for t in _loader_threads() if t not in before]
    assert len(threads) == 4
    del it
    gc.collect()
    for t in threads:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)
    assert [int(y[0, 0]) for _, y in loader] == list(range(40))  # the next loop starts them again
    loader.close()


@pytest.mark.timeout(60)
def test_a_dropped_iteration_ends_its_worker_processes():
    loader = FastLoader(datasets.Squares(n=40), workers=2)
    it = iter(loader)
    next(it)
    workers = [psutil.Process(p.pid) for p in loader._stream._pool._processes]  # this loader's own
    assert len(workers) == 2 and all(w.is_running() for w in workers)
    del it
    gc.collect()
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    loader.close()


def test_a_finished_iteration_dropped_keeps_the_workers_for_the_next_epoch():
    before = set(_loader_threads())
    with FastLoader(datasets.Squares(n=4), workers=2, use_multiprocessing=False) as loader:
        assert len(list(loader)) == 4
        threads = [t for t in _loader_threads() if t not in before]
        assert len(threads) == 2
        assert len(list(loader)) == 4
        assert all(t.is_alive() for t in threads)  # the same threads served the second epoch
        assert [t for t in _loader_threads() if t not in before] == threads


def test_an_iteration_dropped_after_its_last_batch_keeps_the_workers_and_what_they_loaded_ahead():
    # Keras takes an epoch's steps and never asks past the last: that iteration ended, it was not left midway.
    before = set(_loader_threads())
    with FastLoader(datasets.Squares(n=4), workers=2, use_multiprocessing=False) as loader:
        it = iter(loader)
        assert [int(next(it)[1][0, 0]) for _ in range(4)] == [0, 1, 2, 3]
        threads = [t for t in _loader_threads() if t not in before]
        outstanding = loader._stream.outstanding
        del it
        gc.collect()
        assert all(t.is_alive() for t in threads) and outstanding > 0
        assert loader._stream.outstanding == outstanding  # the next epoch's first batches, loaded ahead, kept
        assert [int(y[0, 0]) for _, y in loader] == [0, 1, 2, 3]
        assert loader.state_dict()["epoch"] == 2
