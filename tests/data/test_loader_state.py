"""A FastLoader's position is its own state (issue 34): every iteration is a new epoch from its first batch,
`state_dict()`/`load_state_dict()` carry the position, and the default seed follows
`keras.utils.set_random_seed`."""

import json

import keras
import numpy as np
import pytest

from kfast.data import ArrayDataset
from kfast.data import FastLoader
from kfast.data import position

N = 10  # batches per epoch; batch b holds the value b


def _data(n=N):
    x = np.arange(n, dtype="float32").reshape(-1, 1)
    return ArrayDataset(x, np.arange(n), batch_size=1)


def _ids(batches):
    return [int(y[0]) for _, y in batches]


@pytest.fixture(params=[pytest.param(False, id="threads"), pytest.param(True, id="processes")])
def processes(request):
    return request.param


def test_a_peek_then_a_loop_gives_every_batch(processes):
    with FastLoader(_data(), workers=2, use_multiprocessing=processes) as loader:
        x, y = next(iter(loader))
        assert int(y[0]) == 0
        assert _ids(loader) == list(range(N))
        assert _ids(loader) == list(range(N))  # and the next loop again


def test_a_loop_left_early_leaves_the_next_loop_whole(processes):
    with FastLoader(_data(), workers=2, use_multiprocessing=processes, shuffle=True, seed=4) as loader:
        for i, _ in enumerate(loader):
            if i == 3:
                break
        second = _ids(loader)
        assert sorted(second) == list(range(N))
        # The two epochs are the loader's epochs 0 and 1: the third loop is epoch 2, a permutation of its own.
        third = _ids(loader)
        assert sorted(third) == list(range(N)) and third != second


def test_each_iteration_is_a_new_epoch_with_its_own_order():
    with FastLoader(_data(), workers=2, use_multiprocessing=False, shuffle=True, seed=1) as loader:
        orders = [_ids(loader) for _ in range(3)]
    assert all(sorted(o) == list(range(N)) for o in orders)
    assert len({tuple(o) for o in orders}) == 3
    with FastLoader(_data(), workers=1, use_multiprocessing=False, shuffle=True, seed=1) as loader:
        assert [_ids(loader) for _ in range(3)] == orders  # a function of (seed, epoch) only


def test_an_older_iteration_replaced_by_a_newer_one_says_so():
    with FastLoader(_data(), workers=2, use_multiprocessing=False) as loader:
        old = iter(loader)
        next(old)
        new = iter(loader)
        assert _ids(new) == list(range(N))
        with pytest.raises(RuntimeError, match=r"replaced by a newer iter\(loader\) before it finished"):
            next(old)


@pytest.mark.parametrize("taken", [0, 3, N - 1, N])
def test_a_state_taken_after_some_batches_resumes_in_a_new_loader_with_the_rest(processes, taken):
    with FastLoader(_data(), workers=2, use_multiprocessing=processes, shuffle=True, seed=9) as loader:
        whole = [_ids(loader) for _ in range(2)]
    with FastLoader(_data(), workers=2, use_multiprocessing=processes, shuffle=True, seed=9) as loader:
        stream = iter(loader)
        head = [int(next(stream)[1][0]) for _ in range(taken)]
        state = json.loads(json.dumps(loader.state_dict()))  # plain values: it travels in a checkpoint
    assert head == whole[0][:taken]
    assert (state["version"], state["epoch"], state["batches_done"]) == (
        position.STATE_VERSION, 1 if taken == N else 0, 0 if taken == N else taken)
    with FastLoader(_data(), workers=2, use_multiprocessing=processes, shuffle=True) as resumed:  # another seed
        resumed.load_state_dict(state)
        assert resumed.seed == 9
        rest = [_ids(resumed) for _ in range(2 if taken < N else 1)]
    assert [head + rest[0]] + rest[1:] == whole if taken < N else rest == whole[1:]


def test_a_state_of_one_rank_resumes_that_rank_of_the_same_layout():
    orders = {}
    for rank in (0, 1):
        with FastLoader(_data(), workers=1, use_multiprocessing=False, shuffle=True, seed=5 + rank,
                        rank=rank, size=2) as loader:
            orders[rank] = _ids(loader)
            assert sorted(orders[rank]) == list(range(rank, N, 2))  # its own shard, permuted
            stream = iter(loader)
            next(stream), next(stream)
            state = loader.state_dict()
        with FastLoader(_data(), workers=1, use_multiprocessing=False, rank=rank, size=2) as resumed:
            resumed.load_state_dict(state)
            assert _ids(resumed) == _second_epoch(rank)[2:]  # the rest of epoch 1, in its order
        with FastLoader(_data(), workers=1, use_multiprocessing=False, rank=1 - rank, size=2) as other:
            with pytest.raises(ValueError, match=rf"got the state of rank {rank} of 2, holding that rank's seed only, "
                                                 rf"for rank {1 - rank} of 2"):
                other.load_state_dict(state)


def _second_epoch(rank):
    with FastLoader(_data(), workers=1, use_multiprocessing=False, shuffle=True, seed=5 + rank, rank=rank,
                    size=2) as loader:
        _ids(loader)
        return _ids(loader)


def test_bad_states_are_refused_clearly():
    with FastLoader(_data(), workers=1, use_multiprocessing=False) as loader:
        state = loader.state_dict()
        with pytest.raises(ValueError, match=r"takes the dict that FastLoader.state_dict\(\) returns"):
            loader.load_state_dict([1, 2])
        with pytest.raises(ValueError, match=r"got a state of version 99; this kfast reads version 1"):
            loader.load_state_dict({**state, "version": 99})
        with FastLoader(_data(12), workers=1, use_multiprocessing=False) as longer:
            with pytest.raises(ValueError, match=r"the state of a loader over 10 batches .* this one reads 12"):
                longer.load_state_dict(state)


def _default_seed_and_order(seed):
    """The default seed and first shuffled epoch of a FastLoader made after set_random_seed(seed)."""
    keras.utils.set_random_seed(seed)
    with FastLoader(_data(), workers=1, use_multiprocessing=False, shuffle=True) as loader:
        return loader.seed, _ids(loader)


def test_set_random_seed_fixes_the_default_seed_and_another_seed_changes_it():
    first, order = _default_seed_and_order(1)
    again, order_again = _default_seed_and_order(1)
    other, other_order = _default_seed_and_order(2)
    assert (first, order) == (again, order_again)
    assert other != first and other_order != order


def test_set_random_seed_gives_fit_the_same_order_twice():
    def orders(seed):
        seen = []

        class Note(keras.layers.Layer):
            def call(self, x):
                try:
                    seen.append(int(keras.ops.convert_to_numpy(x)[0, 0]))
                except Exception:  # a symbolic call has no values
                    pass
                return x

        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((1,)), Note(), keras.layers.Dense(1)])
        model.compile("sgd", "mse", run_eagerly=True)
        with FastLoader(_data(), training=True, workers=2, use_multiprocessing=False) as loader:
            model.fit(loader, epochs=2, verbose=0)  # training data: a permutation per epoch
        return seen[-2 * N:]

    one, two, three = orders(3), orders(3), orders(4)
    assert sorted(one[:N]) == sorted(one[N:]) == list(range(N))
    assert one == two
    assert one != three
