"""`kfast.data.pack` and `PackedDataset`: round trips, resumable packing, clear errors (issue 48)."""

import io
import json
import os

import keras
import numpy as np
import pytest
from PIL import Image

from kfast.data import PackedDataset, pack
from kfast.data.packed import layout
from kfast.data.packed.writer import PROGRESS_NAME


def _arrays(n=103):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3, 2)).astype("float32"), rng.integers(0, 10, size=n).astype("int64")


def test_arrays_round_trip_exactly(tmp_path):
    x, y = _arrays()
    out = pack((x, y), str(tmp_path / "p"), shard_size=10, verbose=0)
    data = PackedDataset(out, batch_size=7, shuffle=False)
    assert (len(data), data.num_samples) == (15, 103)
    got_x = np.concatenate([data[i][0] for i in range(len(data))])
    got_y = np.concatenate([data[i][1] for i in range(len(data))])
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert got_x.dtype == x.dtype and got_y.dtype == y.dtype
    info = json.loads((tmp_path / "p" / layout.META_NAME).read_text())
    assert info["samples"] == 103 and [c for _, c in info["shards"]] == [10] * 10 + [3]
    assert not (tmp_path / "p" / PROGRESS_NAME).exists()


def test_dicts_and_single_arrays_keep_their_form(tmp_path):
    a, b = np.arange(20, dtype="int32").reshape(10, 2), np.arange(10, dtype="float64")
    by_name = PackedDataset(pack({"a": a, "b": b}, str(tmp_path / "d"), verbose=0), batch_size=10, shuffle=False)
    batch = by_name[0]
    assert sorted(batch) == ["a", "b"]
    np.testing.assert_array_equal(batch["a"], a)
    alone = PackedDataset(pack(a, str(tmp_path / "x"), verbose=0), batch_size=4, shuffle=False)
    np.testing.assert_array_equal(alone[2], a[8:])


class _Batches(keras.utils.PyDataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        n = 4 if i < 2 else 1
        return np.full((n, 2), i, dtype="float32"), np.arange(i * 4, i * 4 + n)


def test_any_dataset_of_batches_is_cut_into_samples(tmp_path):
    data = PackedDataset(pack(_Batches(), str(tmp_path / "b"), shard_size=3, verbose=0), batch_size=9, shuffle=False)
    assert data.num_samples == 9
    assert data[0][1].tolist() == list(range(9))
    assert data[0][0][:, 0].tolist() == [0] * 4 + [1] * 4 + [2]


def _image(seed, size=(6, 5)):
    return np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8)


def _folder(root, per_class=4, fmt="PNG"):
    for c in ("cat", "dog"):
        os.makedirs(root / c)
        for i in range(per_class):
            Image.fromarray(_image(hash((c, i)) % 1000)).save(root / c / f"{i}.{fmt.lower()}", fmt)
    return root


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_images_round_trip_as_their_files_decode(tmp_path, fmt):
    root = _folder(tmp_path / "imgs", fmt=fmt)
    data = PackedDataset(pack(str(root), str(tmp_path / "p"), verbose=0), batch_size=8, shuffle=False)
    assert data.classes == ["cat", "dog"]
    images, labels = data[0]
    files = sorted((root / c / f, label) for label, c in enumerate(["cat", "dog"]) for f in os.listdir(root / c))
    for (path, label), image, got in zip(files, images, labels):
        with Image.open(path) as img:
            np.testing.assert_array_equal(image, np.asarray(img.convert("RGB")))
        assert got == label


def test_a_file_that_does_not_open_is_left_out_and_named(tmp_path):
    root = _folder(tmp_path / "imgs", per_class=3)
    (root / "dog" / "broken.png").write_bytes(b"not an image")
    pack(str(root), str(tmp_path / "p"), verbose=0)
    info = layout.PackInfo.from_json((tmp_path / "p" / layout.META_NAME).read_text(), "meta")
    assert info.samples == 6 and info.skipped_count == 1 and "broken.png" in info.skipped[0]


def test_a_stopped_pack_goes_on_with_the_missing_shards(tmp_path):
    x, y = _arrays(50)
    out = tmp_path / "p"
    pack((x, y), str(out), shard_size=10, verbose=0)
    # As if stopped after three shards: the metadata not written, two shards missing, one half-written file.
    os.unlink(out / layout.META_NAME)
    shards = json.loads(json.dumps({str(i): {"samples": 10, "skipped": []} for i in range(5)}))
    plan = {"source": "arrays x(50, 3, 2), y(50,)", "samples": 50, "shard_size": 10,
            "fields": [{"name": "x", "kind": "array", "dtype": "<f4", "shape": [3, 2]},
                       {"name": "y", "kind": "array", "dtype": "<i8", "shape": []}]}
    (out / PROGRESS_NAME).write_text(json.dumps({"plan": plan, "shards": shards}))
    kept = {n: os.stat(out / layout.shard_name(n, 5)).st_mtime_ns for n in (0, 1, 2)}
    for n in (3, 4):
        os.unlink(out / layout.shard_name(n, 5))
    pack((x, y), str(out), shard_size=10, verbose=0)
    assert {n: os.stat(out / layout.shard_name(n, 5)).st_mtime_ns for n in (0, 1, 2)} == kept  # not written again
    data = PackedDataset(str(out), batch_size=50, shuffle=False)
    np.testing.assert_array_equal(data[0][0], x)
    with pytest.raises(ValueError, match="finished pack already"):
        pack((x, y), str(out), verbose=0)


def test_a_pack_in_progress_of_another_source_is_not_mixed_in(tmp_path):
    x, y = _arrays(20)
    out = tmp_path / "p"
    pack((x, y), str(out), shard_size=10, verbose=0)
    os.unlink(out / layout.META_NAME)
    (out / PROGRESS_NAME).write_text(json.dumps({"plan": {"source": "other"}, "shards": {}}))
    with pytest.raises(ValueError, match="another source or shard size"):
        pack((x, y), str(out), shard_size=10, verbose=0)


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="lengths"):
        pack((np.zeros(3), np.zeros(4)), str(tmp_path / "a"), verbose=0)
    with pytest.raises(ValueError, match="not a folder"):
        pack(str(tmp_path / "missing"), str(tmp_path / "b"), verbose=0)
    with pytest.raises(ValueError, match="no kfast-pack.json"):
        PackedDataset(str(tmp_path), batch_size=2)
    (tmp_path / layout.META_NAME).write_text("{}")
    with pytest.raises(ValueError, match="not a kfast pack"):
        PackedDataset(str(tmp_path), batch_size=2)
    out = pack(np.zeros((4, 1)), str(tmp_path / "c"), verbose=0)
    with pytest.raises(ValueError, match="on_bad_record"):
        PackedDataset(out, on_bad_record="ignore")


def test_several_ranks_need_one_seed(tmp_path):
    from kfast._core import topology

    class TwoRanks:
        def rank(self): return 0
        def size(self): return 2
        def local_rank(self): return 0
        def local_size(self): return 2

    out = pack(np.zeros((4, 1)), str(tmp_path / "c"), verbose=0)
    topology.set_current(TwoRanks())
    try:
        with pytest.raises(ValueError, match="seed=<int>, the same on every rank"):
            PackedDataset(out, batch_size=2)
        assert PackedDataset(out, batch_size=2, seed=3).seed == 3
    finally:
        topology.set_current(None)


def test_an_image_pack_resizes_to_image_size(tmp_path):
    root = tmp_path / "imgs"
    for c, size in (("a", (6, 5)), ("b", (9, 4))):
        os.makedirs(root / c)
        for i in range(2):
            buf = io.BytesIO()
            Image.fromarray(_image(i, size)).save(buf, "PNG")
            (root / c / f"{i}.png").write_bytes(buf.getvalue())
    out = pack(str(root), str(tmp_path / "p"), verbose=0)
    with pytest.raises(ValueError, match="image_size"):
        PackedDataset(out, batch_size=4, shuffle=False)[0]
    assert PackedDataset(out, batch_size=4, shuffle=False, image_size=(8, 8))[0][0].shape == (4, 8, 8, 3)


def test_a_validation_split_holds_out_the_same_samples_every_epoch(tmp_path):
    x = np.arange(100).reshape(100, 1)
    out = pack(x, str(tmp_path / "p"), shard_size=16, verbose=0)
    train = PackedDataset(out, batch_size=10, seed=3, validation_split=0.2, subset="training")
    val = PackedDataset(out, batch_size=10, seed=3, validation_split=0.2, subset="validation", shuffle=False)
    held = sorted(int(v) for b in range(len(val)) for v in val[b][:, 0])
    assert len(held) == 20 and held != list(range(20))
    for epoch in range(2):
        train.set_epoch(epoch)
        seen = sorted(int(v) for b in range(len(train)) for v in train[b][:, 0])
        assert seen == sorted(set(range(100)) - set(held))
    with pytest.raises(ValueError, match="needs seed"):
        PackedDataset(out, validation_split=0.2, subset="training")


def test_the_command_line_packs_a_folder_and_arrays(tmp_path, capsys):
    from kfast.cli import main

    root = _folder(tmp_path / "imgs", per_class=2)
    assert main(["pack", str(root), str(tmp_path / "p"), "--shard-size", "3"]) == 0
    assert "PackedDataset(" in capsys.readouterr().out
    assert PackedDataset(str(tmp_path / "p"), batch_size=4, shuffle=False).classes == ["cat", "dog"]
    np.savez(tmp_path / "a.npz", x=np.arange(6.0).reshape(3, 2), y=np.arange(3))
    assert main(["pack", str(tmp_path / "a.npz"), str(tmp_path / "q")]) == 0
    assert PackedDataset(str(tmp_path / "q"), batch_size=3, shuffle=False)[0][1].tolist() == [0, 1, 2]


def test_the_workers_read_a_pack_without_keras(tmp_path):
    from helpers import batch_in_fresh_python

    out = pack(np.arange(40).reshape(20, 2), str(tmp_path / "p"), shard_size=6, verbose=0)
    data = PackedDataset(out, batch_size=4, seed=2)
    data.set_epoch(1)
    batch, imported = batch_in_fresh_python(data.worker_dataset(), 2, tmp_path)
    assert not imported["keras"]
    np.testing.assert_array_equal(batch, data[2])
