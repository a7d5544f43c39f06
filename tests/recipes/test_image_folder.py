"""ImageFolder lists its folder and nothing more before the first step; each image is checked as it is read."""

import io
import os
import re
import sys

import numpy as np
import pytest
from PIL import Image

from kfast.recipes import image_classification

SKIP_HINT = "pass --skip-bad-files"

# File-system calls under the folder a test watches, seen through Python's audit events (the stdlib's seam for
# this; nothing is patched). The hook stays for the session, as audit hooks do, and is idle while nobody watches.
_watched: list[str] = []
_events: list[tuple[str, str]] = []


def _audit(event, args):
    if _watched and event in ("open", "os.scandir", "os.listdir") and args and isinstance(args[0], str) \
            and args[0].startswith(_watched[0]):
        _events.append((event, args[0]))


sys.addaudithook(_audit)


@pytest.fixture
def file_calls():
    """Starts recording the opens and listings under a folder: `watch(root)`; returns the list they go to."""
    def watch(root):
        _watched[:] = [str(root)]
        return _events

    yield watch
    _watched.clear()
    _events.clear()


def png_bytes(value=0, size=4):
    out = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(out, "PNG")
    return out.getvalue()


def folder_of(root, per_class, classes=("a", "b")):
    """Writes `per_class` tiny PNGs under root/<class>/ (class k's pixels are all k) and returns root as a string."""
    for k, c in enumerate(classes):
        os.makedirs(root / c)
        (root / c / "0.png").write_bytes(png_bytes(k))
        for i in range(1, per_class):
            os.link(root / c / "0.png", root / c / f"{i}.png")  # one file's bytes, many names: cheap
    return str(root)


def test_a_folder_of_20k_images_gives_its_first_batch_before_any_per_file_check(tmp_path, file_calls):
    root = folder_of(tmp_path / "imgs", per_class=10_000)
    calls = file_calls(root)
    folder = image_classification.ImageFolder(root, batch_size=32, size=4)
    assert len(folder.files) == 20_000 and len(folder) == 625
    assert folder.files_read == 0 and folder.bad_files == {}
    assert [event for event, _ in calls] == ["os.listdir", "os.scandir", "os.scandir"], calls  # one listing, no open
    images, labels = folder[0]
    assert images.shape == (32, 4, 4, 3) and labels.shape == (32,)
    np.testing.assert_array_equal(images[:, 0, 0, 0], labels)  # each image came with its own class's label
    assert folder.files_read == 32  # the first batch opened its own files and no others
    assert sum(event == "open" for event, _ in calls) == 32


def test_fewer_than_two_classes_is_found_from_the_listing(tmp_path, file_calls):
    root = folder_of(tmp_path / "imgs", per_class=3, classes=("cats",))
    os.makedirs(tmp_path / "imgs" / "dogs")
    (tmp_path / "imgs" / "dogs" / "notes.txt").write_text("not an image")
    calls = file_calls(root)
    with pytest.raises(ValueError, match=r"found images in 1 class folder\(s\) under '.*': cats; a classifier needs"):
        image_classification.ImageFolder(root, batch_size=4, size=4)
    assert not any(event == "open" for event, _ in calls)


def batch_of(folder, path):
    """The index of the batch that reads `path` this epoch."""
    row = next(i for i, (p, _) in enumerate(folder.files) if p == path)
    return int(np.flatnonzero(folder.order == row)[0]) // folder.batch_size


def test_a_corrupt_file_is_named_when_its_batch_is_read(tmp_path):
    root = folder_of(tmp_path / "imgs", per_class=4)
    bad = str(tmp_path / "imgs" / "b" / "2.jpg")
    with open(bad, "wb") as f:
        f.write(b"\x00not an image at all" * 10)
    folder = image_classification.ImageFolder(root, batch_size=3, size=4)  # 9 images: 3 full batches
    assert folder.files_read == 0
    for index in range(len(folder)):
        if index == batch_of(folder, bad):
            with pytest.raises(ValueError, match=rf"ImageFolder cannot decode {re.escape(bad)} \(\w+Error: .*"
                                                 rf"{SKIP_HINT} \(ImageFolder\(skip_bad_files=True\)\)"):
                folder[index]
        else:
            assert folder[index][0].shape == (3, 4, 4, 3)


def test_skip_bad_files_completes_the_epoch_counting_and_naming_the_bad_file(tmp_path, capsys):
    root = folder_of(tmp_path / "imgs", per_class=4)
    bad = str(tmp_path / "imgs" / "a" / "2.png")
    os.unlink(bad)
    with open(bad, "w") as f:
        f.write("<html>not an image</html>")
    folder = image_classification.ImageFolder(root, batch_size=3, size=4, skip_bad_files=True)
    for epoch in range(2):
        folder.set_epoch(epoch)
        batches = [folder[i] for i in range(len(folder))]
        images = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        assert images.shape == (8, 4, 4, 3)  # the next readable image took the bad one's place
        np.testing.assert_array_equal(images[:, 0, 0, 0], labels)
    assert folder.files_read == 2 * 9 and list(folder.bad_files) == [bad]  # read twice, counted once
    err = capsys.readouterr().err
    assert err.count("--skip-bad-files:") == 1, err
    assert re.search(rf"cannot decode {re.escape(bad)} \(\w+Error: .*\); the next image takes its place \(1 "
                     rf"unreadable of \d+ images read by process {os.getpid()} so far\)", err), err
    # The count belongs to the dataset object: another one names the file again.
    other = image_classification.ImageFolder(root, batch_size=8, size=4, skip_bad_files=True)
    other[0]
    assert list(other.bad_files) == [bad] and capsys.readouterr().err.count(f"cannot decode {bad}") == 1
    with pytest.warns(DeprecationWarning, match="ImageFolder.skipped is deprecated.*bad_files"):
        assert other.skipped == [bad]


def test_skip_bad_files_stops_past_the_cap_with_the_count(tmp_path, capsys):
    root = folder_of(tmp_path / "imgs", per_class=2)
    for i in range(12):
        (tmp_path / "imgs" / "ab"[i % 2] / f"bad{i:02d}.png").write_bytes(b"GIF89a but not really")
    folder = image_classification.ImageFolder(root, batch_size=4, size=4, skip_bad_files=True)
    with pytest.raises(ValueError, match=r"--skip-bad-files: 11 of the \d+ images process \d+ read under '.*' cannot "
                                         r"be decoded \(more than 10%\), among them .*bad\d\d\.png .*wrong folder.*"
                                         r"index_images lists every unreadable file"):
        for index in range(len(folder)):
            folder[index]
    err = capsys.readouterr().err
    assert err.count("cannot decode") == 5 and "further ones are counted, not named" in err, err  # the first few
    assert re.search(r"--skip-bad-files: 8 unreadable of \d+ images read by process \d+ so far\.", err), err


def test_the_workers_get_the_batches_without_keras(tmp_path):
    # The benchmark's finding (issue 48): each worker of an ImageFolder imported Keras (650 MB); its worker form
    # unpickles in a fresh Python without it, and serves the same batches.
    from helpers import batch_in_fresh_python

    root = image_classification.write_sample(str(tmp_path / "imgs"), classes=2, per_class=6, size=8)
    folder = image_classification.ImageFolder(root, batch_size=4, size=8, augment=True, seed=3)
    folder.set_epoch(2)
    (images, labels), imported = batch_in_fresh_python(folder.worker_dataset(), 1, tmp_path)
    assert not imported["keras"] and not imported["tensorflow"]
    want_images, want_labels = folder[1]
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)
