"""Recipes refuse corrupted data, naming the file, row and column, instead of training on it."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from kfast.recipes import image_classification
from kfast.recipes import tabular
from kfast.recipes import text_classification

KFAST = os.path.join(os.path.dirname(sys.executable), "kfast")
SKIP_HINT = "pass --skip-bad-files"


def image_folder(root, classes=("a", "b"), per_class=6, size=16, seed=0):
    """Writes `per_class` random RGB PNGs under root/<class>/ and returns root as a string."""
    rng = np.random.default_rng(seed)
    for c in classes:
        os.makedirs(root / c, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return str(root)


def truncated(path, fmt, seed=1):
    """Writes a 64x64 image in `fmt` to `path`, keeping only the first 60% of its bytes."""
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path, fmt)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 6 // 10])
    return str(path)


def write_csv(path, rows, header="f0,f1,f2,label"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


def good_rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [",".join(f"{v:.3f}" for v in rng.normal(size=3)) + f",{i % 2}" for i in range(n)]


# Images

def test_16_bit_png_is_scaled_to_8_bits_not_clipped(tmp_path):
    pixels = np.linspace(0, 65535, 64).reshape(8, 8).astype(np.uint16)
    for c in ("a", "b"):
        os.makedirs(tmp_path / c)
        for i in range(2):
            Image.fromarray(pixels).save(tmp_path / c / f"{i}.png")  # 16-bit grayscale: opens as mode I;16
    images, _ = image_classification.ImageFolder(str(tmp_path), batch_size=4, size=8)[0]
    expected = np.rint(pixels / 257).astype(np.uint8)
    assert images.shape == (4, 8, 8, 3) and images.dtype == np.uint8
    for image in images:
        for channel in range(3):
            np.testing.assert_array_equal(image[..., channel], expected)


def test_palette_and_alpha_images_load_as_their_colours(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    palette = Image.fromarray(rgb).convert("P")
    palette.save(tmp_path / "p.png", transparency=bytes(range(256)))  # per-entry alpha: warns if converted to RGB
    Image.fromarray(np.dstack([rgb, np.full((8, 8), 7, np.uint8)])).save(tmp_path / "rgba.png")
    Image.fromarray(rgb[..., 0]).convert("LA").save(tmp_path / "la.png")
    expected = {"p.png": np.asarray(palette.convert("RGB")), "rgba.png": rgb,
                "la.png": np.repeat(rgb[..., :1], 3, axis=2)}
    for name, want in expected.items():
        with Image.open(tmp_path / name) as img:
            np.testing.assert_array_equal(np.asarray(image_classification.to_rgb(img, name)), want)


def test_single_class_folder_is_an_error(tmp_path):
    root = image_folder(tmp_path, classes=("cats",))
    os.makedirs(tmp_path / "dogs")  # an empty folder is no class either
    with pytest.raises(ValueError, match=r"in 1 class folder\(s\) under '.*': cats; a classifier needs at least two"):
        image_classification.ImageFolder(root, batch_size=4, size=16)


@pytest.mark.parametrize("fmt, name", [("PNG", "broken.png"), ("JPEG", "broken.jpg")])
def test_truncated_image_is_an_error_naming_the_file(fmt, name, tmp_path):
    root = image_folder(tmp_path)
    bad = truncated(tmp_path / "b" / name, fmt)
    folder = image_classification.ImageFolder(root, batch_size=13, size=16)  # lists only: the check comes on reading
    with pytest.raises(ValueError, match=rf"cannot decode {re.escape(bad)} \(\w+Error.*{SKIP_HINT}"):
        folder[0]
    # index_images is the explicit check of every file before training.
    with pytest.raises(ValueError, match=rf"1 of 13 image\(s\) under .* cannot be read: {re.escape(bad)} \(\w+Error"):
        image_classification.index_images(root)


def test_skip_bad_files_replaces_unreadable_images_and_names_them(tmp_path, capsys):
    root = image_folder(tmp_path)
    bad = [truncated(tmp_path / "a" / "x.jpg", "JPEG"), truncated(tmp_path / "b" / "y.png", "PNG")]
    (tmp_path / "b" / "z.png").write_text("<html>not an image</html>")
    bad.append(str(tmp_path / "b" / "z.png"))
    folder = image_classification.ImageFolder(root, batch_size=4, size=16, skip_bad_files=True)
    images = np.concatenate([folder[i][0] for i in range(len(folder))])
    assert images.shape == (15, 16, 16, 3)  # each bad image's place taken by the next readable one
    assert sorted(folder.bad_files) == sorted(bad)
    err = capsys.readouterr().err
    assert all(err.count(f"--skip-bad-files: cannot decode {path} (") == 1 for path in bad), err
    # The explicit check up front leaves them out instead, and lists them.
    classes, files, skipped = image_classification.index_images(root, skip_bad_files=True)
    assert skipped == bad and len(files) == 12 and not set(skipped) & {path for path, _ in files}


def test_image_that_fails_in_a_worker_is_named_or_replaced(tmp_path, capsys):
    root = image_folder(tmp_path)
    bad = truncated(tmp_path / "a" / "00.png", "PNG")  # its header is whole: only decoding it fails
    folder = image_classification.ImageFolder(root, batch_size=13, size=16)
    with pytest.raises(ValueError, match=rf"cannot decode {re.escape(bad)} \(OSError: .*truncated.*{SKIP_HINT}"):
        folder[0]
    folder = image_classification.ImageFolder(root, batch_size=13, size=16, skip_bad_files=True)
    for _ in range(2):  # named once per process, however often it is read
        images, labels = folder[0]
        assert images.shape == (13, 16, 16, 3) and sorted(labels) == [0] * 7 + [1] * 6
    assert capsys.readouterr().err.count(f"--skip-bad-files: cannot decode {bad}") == 1


@pytest.mark.timeout(180)
def test_kfast_train_skip_bad_files_prints_how_many_it_skipped(tmp_path):  # tests/conftest.py marks it by this name
    image_folder(tmp_path / "imgs", per_class=8)
    truncated(tmp_path / "imgs" / "a" / "bad.png", "PNG")
    proc = subprocess.run([KFAST, "train", "image-classification", "--data", "imgs", "--skip-bad-files", "--epochs",
                           "1", "--workers", "1", "--image-size", "16", "--batch-size", "4", "--warmup-epochs", "0"],
                          capture_output=True, text=True, timeout=150, cwd=tmp_path,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KFAST_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "--skip-bad-files: images that cannot be decoded are skipped as they are read" in proc.stdout
    bad = os.path.join("imgs", "a", "bad.png")
    # Named, and counted, by the process that read it.
    assert re.search(rf"--skip-bad-files: cannot decode {re.escape(bad)} \(OSError.*\(1 unreadable of \d+ images read "
                     rf"by process \d+ so far\)", proc.stderr), proc.stderr
    assert " - loss: " in proc.stdout  # it trained on the rest


# Tables

@pytest.mark.parametrize("cell", ["nan", "inf", "-inf"])
def test_non_finite_csv_cell_is_an_error_naming_line_and_column(cell, tmp_path):
    rows = good_rows()
    rows[6] = rows[6].split(",")[0] + f",{cell}," + ",".join(rows[6].split(",")[2:])
    rows[9] = "nan," + ",".join(rows[9].split(",")[1:])
    rows.insert(3, "")  # blank lines are skipped by the reader but counted by the user's editor
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(ValueError, match=rf"data\.csv, line 9 \(counting from 1, the header being line 1\), "
                                         rf"column 2 \('f1'\): got '{cell}'; every cell must be a finite number, "
                                         rf"and 2 cell\(s\) are NaN or infinite\. Fill them in"):
        tabular.read(path)


def test_non_integer_label_is_an_error_naming_line_and_value(tmp_path):
    rows = good_rows()
    rows[4] = ",".join(rows[4].split(",")[:3]) + ",0.37"
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(ValueError, match=r"data\.csv, line 6 .*, column 4 \('label'\): got '0\.37'; labels must be "
                                         r"class ids 0, 1, 2, \.\.\., and 1 of 40 are not"):
        tabular.read(path)


def test_single_label_value_is_an_error(tmp_path):
    path = write_csv(tmp_path / "data.csv", [row[:-1] + "1" for row in good_rows()])
    with pytest.raises(ValueError, match=r"data\.csv: the labels hold 1 class\(es\) \[1\] in 40 rows; a classifier "
                                         r"needs at least two"):
        tabular.read(path)


def test_unparsable_csv_cell_is_an_error_naming_line_and_column(tmp_path):
    rows = good_rows()
    rows[2] = "1.0,,2.0,1"
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(ValueError, match=r"data\.csv, line 4 .*, column 2 \('f1'\): got ''; expected a number"):
        tabular.read(path)


def test_a_csv_with_a_header_and_no_rows_says_so(tmp_path):
    path = write_csv(tmp_path / "data.csv", [])
    with pytest.raises(ValueError, match=r"data\.csv has a header of 4 column\(s\) and no data rows"):
        tabular.read(path)


@pytest.mark.parametrize("x_bad, y_bad, message", [
    ((3, 1), None, r"data\.npz: x\[3, 1\] is nan; x must hold finite numbers"),
    (None, 5, r"data\.npz: y\[5\] is 0\.5; labels must be class ids"),
], ids=["nan-feature", "fractional-label"])
def test_npz_non_finite_feature_or_non_integer_label_is_an_error(x_bad, y_bad, message, tmp_path):
    x = np.random.default_rng(0).normal(size=(20, 3))
    y = np.arange(20) % 2 * 1.0
    if x_bad:
        x[x_bad] = np.nan
    if y_bad:
        y[y_bad] = 0.5
    np.savez(tmp_path / "data.npz", x=x, y=y)
    with pytest.raises(ValueError, match=message):
        tabular.read(str(tmp_path / "data.npz"))


def test_clean_csv_reads_as_before(tmp_path):
    x, y = tabular.read(tabular.write_sample(str(tmp_path / "data.csv"), samples=64, features=4))
    assert x.shape == (64, 4) and x.dtype == np.float32 and y.dtype == np.int32 and set(y) == {0, 1, 2}


# Text

def test_latin_1_text_file_is_an_error_naming_file_and_offset(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta\n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("gamma delta\ncafé omega\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / 'b.txt'))} is not valid UTF-8: byte 0xe9 at "
                                         r"offset 15 \(line 2\).*Re-encode it as UTF-8"):
        text_classification.read(str(tmp_path))


def test_empty_class_text_file_is_an_error(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"b\.txt holds no documents"):
        text_classification.read(str(tmp_path))


def _args(batch_size, seed=0):
    import argparse

    return argparse.Namespace(batch_size=batch_size, seed=seed)


@pytest.mark.parametrize("n, batch_size, ranks, fraction, val_size", [
    (1000, 32, 1, 1 / 8, 125), (1000, 32, 2, 1 / 8, 125), (300, 32, 2, 1 / 8, 64), (96, 4, 2, 0.2, 19),
])
def test_every_recipe_splits_rows_the_same_way(n, batch_size, ranks, fraction, val_size):
    from kfast.recipes import _common

    train, val = _common.split_rows(n, _args(batch_size), fraction=fraction, ranks=ranks)
    assert len(val) == val_size and len(train) == n - val_size
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(n))  # disjoint, nothing lost
    again, _ = _common.split_rows(n, _args(batch_size), fraction=fraction, ranks=ranks)
    assert again.tolist() == train.tolist()  # every rank computes the same split
    other, _ = _common.split_rows(n, _args(batch_size, seed=1), fraction=fraction, ranks=ranks)
    assert other.tolist() != train.tolist()


def test_too_few_samples_for_a_batch_per_rank_in_both_parts_say_how_many():
    from kfast.recipes import _common

    # The image sample folder (96 images) at the default batch of 32 on 2 ranks: 19 validation images
    # once made a single batch that 2 ranks cannot share; now the split says what is needed.
    with pytest.raises(ValueError, match=r"96 samples are too few .*--batch-size 32 on 2 rank\(s\): each part "
                                         r"needs at least 64 .*smaller --batch-size"):
        _common.split_rows(96, _args(32), fraction=0.2, ranks=2)
