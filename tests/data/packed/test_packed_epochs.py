"""A packed dataset through FastLoader: every sample once per epoch over several ranks, a new permutation each
epoch that moves samples between ranks, an exact resume on another number of ranks, and bad records under a
policy (issue 48, items 3-5)."""

import os

import numpy as np
import pytest

from kfast.data import FastLoader, PackedDataset, pack
from kfast.data.packed import layout

MODES = [pytest.param(False, id="threads"), pytest.param(True, id="processes")]
N, B = 1000, 10  # samples; batch size. Sample i's x is i, so a batch says which samples it holds.


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    x = np.arange(N, dtype="int64").reshape(N, 1)
    return pack((x, x[:, 0] % 7), str(tmp_path_factory.mktemp("pack")), shard_size=64, verbose=0)


def _loader(path, rank, size, use_multiprocessing=False, **kwargs):
    data = PackedDataset(path, batch_size=B, seed=42, **kwargs)
    return FastLoader(data, training=True, rank=rank, size=size, workers=2, use_multiprocessing=use_multiprocessing,
                      seed=rank)


def _samples(batches):
    return [int(v) for x, _ in batches for v in x[:, 0]]


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_three_ranks_read_every_sample_once_with_equal_batches(packed, use_multiprocessing):
    loaders = [_loader(packed, r, 3, use_multiprocessing) for r in range(3)]
    try:
        per_epoch = []
        for _ in range(2):
            epoch = [_samples(loader) for loader in loaders]
            assert [len(s) for s in epoch] == [33 * B] * 3  # 100 batches: 33 each, one left out
            seen = [i for s in epoch for i in s]
            assert len(set(seen)) == len(seen) == 990  # no sample twice; 10 left out (the batch not dealt)
            per_epoch.append(epoch)
        first, second = per_epoch
        assert [s for s in first] != [s for s in second]  # another permutation
        moved = sum(len(set(first[r]) - set(second[r])) for r in range(3))
        assert moved > 600  # most samples go to another rank (2/3 expected)
        assert set(range(N)) - set(i for s in first for i in s) != set(range(N)) - set(i for s in second for i in s)
    finally:
        for loader in loaders:
            loader.close()


def test_stopped_on_four_ranks_and_resumed_on_two_reads_the_rest_of_the_epoch_once(packed):
    four = [_loader(packed, r, 4) for r in range(4)]
    its = [iter(loader) for loader in four]
    trained = [i for _ in range(7) for it in its for i in _samples([next(it)])]  # 7 steps on each of 4 ranks
    # What RankZeroCheckpoint records: rank 0's state with every rank's seed.
    states = [loader.state_dict() for loader in four]
    assert [s["batches_done"] for s in states] == [7] * 4 and states[0]["dataset"] == {"seed": 42}
    state = {**states[0], "seeds": [s["seed"] for s in states]}
    for loader in four:
        loader.close()
    two = [_loader(packed, r, 2) for r in range(2)]
    for loader in two:
        loader.dataset.load_state_dict({"seed": 0})  # a wrong seed: the state must put the recorded one back
        loader.load_state_dict(state)
    rest = [_samples(loader) for loader in two]
    assert len(rest[0]) == len(rest[1])
    union = trained + rest[0] + rest[1]
    assert len(union) == len(set(union)) == 1000  # each once: 100 batches, 28 trained, 72 dealt to 2 ranks
    # The next epoch on two ranks: a new permutation, every rank as many batches.
    nxt = [_samples(loader) for loader in two]
    assert len(nxt[0]) == len(nxt[1]) == 500 and set(nxt[0] + nxt[1]) == set(range(N))
    for loader in two:
        loader.close()


def test_a_shard_window_reads_few_shards_at_a_time(packed):
    data = PackedDataset(packed, batch_size=B, seed=1, shuffle_window=2)
    shards = [set((np.asarray(data.indices(i)) // 64).tolist()) for i in range(len(data))]
    assert max(len(s) for s in shards) <= 4  # a batch at a window's edge touches the next window's shards
    assert sorted(i for b in range(len(data)) for i in data.indices(b)) == list(range(N))


def _corrupt(path, tmp_path, records):
    """A copy of the pack at `path` whose first shard has `records` replaced by bytes of the wrong length."""
    from array_record.python import array_record_module

    out = tmp_path / "bad"
    os.makedirs(out)
    for name in os.listdir(path):
        if name.endswith(".array_record") or name == layout.META_NAME:
            os.link(os.path.join(path, name), out / name)
    first = layout.shard_name(0, 16)
    reader = array_record_module.ArrayRecordReader(str(out / first))
    kept = reader.read_all()
    reader.close()
    os.unlink(out / first)
    writer = array_record_module.ArrayRecordWriter(str(out / first), "group_size:1,uncompressed")
    for i, record in enumerate(kept):
        writer.write(b"\x00garbage" if i in records else record)
    writer.close()
    return str(out)


@pytest.mark.parametrize("use_multiprocessing", MODES)
def test_a_bad_record_under_skip_is_counted_named_and_the_epoch_ends(packed, tmp_path, capfd, use_multiprocessing):
    bad = _corrupt(packed, tmp_path, {3, 40})
    data = PackedDataset(bad, batch_size=B, shuffle=False, on_bad_record="skip")
    with FastLoader(data, workers=2, use_multiprocessing=use_multiprocessing) as loader:
        seen = _samples(loader)
    assert sorted(seen) == sorted(set(range(N)) - {3, 40})
    assert data.bad_records == 2 and "record 3 (sample 3)" in data.bad_record_names[0]
    assert "skipped a bad record" in capfd.readouterr().err


def test_a_bad_record_raises_naming_it_and_the_loop_goes_on(packed, tmp_path):
    bad = _corrupt(packed, tmp_path, {3})
    with FastLoader(PackedDataset(bad, batch_size=B, shuffle=False), workers=1, use_multiprocessing=False) as loader:
        it, errors, got = iter(loader), [], 0
        for _ in range(200):
            try:
                got += len(next(it)[0])
            except ValueError as e:
                errors.append(str(e))
            except StopIteration:
                break
    assert len(errors) == 1 and "shard-00000-of-00016.array_record record 3 (sample 3)" in errors[0]
    assert "on_bad_record='skip'" in errors[0] and got == N - B


def test_past_max_bad_records_the_run_stops(packed, tmp_path):
    bad = _corrupt(packed, tmp_path, {1, 2, 3})
    data = PackedDataset(bad, batch_size=B, shuffle=False, on_bad_record="skip", max_bad_records=2)
    with FastLoader(data, workers=1, use_multiprocessing=False) as loader:
        with pytest.raises(ValueError, match="skipped 3 bad records, more than max_bad_records=2"):
            list(loader)
