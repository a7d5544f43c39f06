"""image-classification: a small ResNet-style CNN on an image folder or on generated images.

    kfast train image-classification                       # synthetic images
    kfast train image-classification --make-sample imgs    # write a small PNG folder
    kfast train image-classification --data imgs           # one sub-folder per class, JPEG or PNG
    kfast train image-classification --data imgs --skip-bad-files   # train past unreadable images
    kfast pack imgs imgs-packed && kfast train image-classification --data imgs-packed   # packed shards
    horovodrun -np 2 python recipes/image_classification.py --epochs 3
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from typing import Any

import keras
import numpy as np

from kfast.data._image_files import MAX_BAD_FRACTION
from kfast.data._image_files import ImageFiles
from kfast.data._image_files import to_rgb
from kfast.data._worker_form_dataset import WorkerFormDataset

if TYPE_CHECKING:
    import argparse

    from kfast.recipes._common import Recipe

SUMMARY = "ResNet-style CNN on an image folder (one sub-folder per class) or synthetic images"
_EXTENSIONS = (".png", ".jpg", ".jpeg")
# index_images decodes folders up to this size in full; larger ones only have their headers read.
_DECODE_CHECK_BYTES = 256 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=3, batch_size=32, lr=1e-3)
    parser.add_argument("--image-size", type=int, default=32, help="side of the square input (default 32)")
    parser.add_argument("--classes", type=int, default=4, help="classes of synthetic data (default 4)")
    parser.add_argument("--samples", type=int, default=1024, help="synthetic training images (default 1024)")
    parser.add_argument("--skip-bad-files", action="store_true",
                        help="skip images that cannot be decoded as they are read (naming the first few on stderr) "
                             "instead of stopping; more than 10%% of those read stops the run")


def synthetic_image(label: int, classes: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A learnable image: a bright square whose position encodes the class, on noise."""
    image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    cell = size // 2
    row, col = divmod(label % 4, 2)
    image[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell, label % 3] = 255
    return image


class SyntheticImages(keras.utils.PyDataset):
    """`samples` generated images in batches; image i is a pure function of (seed, i)."""

    def __init__(self, samples: int, batch_size: int, size: int, classes: int, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.samples, self.batch_size, self.size, self.classes, self.seed = samples, batch_size, size, classes, seed

    def __len__(self) -> int:
        return -(-self.samples // self.batch_size)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        ids = range(index * self.batch_size, min(self.samples, (index + 1) * self.batch_size))
        labels = np.array([i % self.classes for i in ids], dtype="int32")
        images = np.stack([synthetic_image(label, self.classes, self.size, np.random.default_rng([self.seed, i]))
                           for i, label in zip(ids, labels)])
        return images, labels


def _class_names(root: str) -> list[str]:
    # Hidden folders (.ipynb_checkpoints, .DS_Store's kin) are not classes.
    return sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))


def _list_images(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """Class names and `(path, label)` pairs under root/<class>/: one listing of each folder, no file opened or sized."""
    classes = _class_names(root)
    files: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        with os.scandir(folder) as entries:  # names only: DirEntry.is_file() may stat, and a folder fails when read
            found = sorted(entry.name for entry in entries if entry.name.lower().endswith(_EXTENSIONS))
        files += [(os.path.join(folder, f), label) for f in found]
    return classes, files


def _require_two_classes(root: str, classes: list[str], files: list[tuple[str, int]], what: str = "images") -> None:
    found = sorted({classes[label] for _, label in files})
    if len(found) < 2:
        raise ValueError(f"ImageFolder found {what} in {len(found)} class folder(s) under {root!r}"
                         f"{': ' + ', '.join(found) if found else ''}; a classifier needs at least two. Put each "
                         f"class's images in its own sub-folder: {root}/<class>/<image>.png.")


def _problem(path: str, decode: bool) -> str | None:
    """Why the image at `path` cannot be used (None if it can): its header only, or a full decode."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            if decode:
                img.draft("RGB", (64, 64))  # JPEGs decode at reduced scale: every byte still read, much less work
                to_rgb(img, path)
    except Exception as e:  # noqa: BLE001 - any failure to read makes the file unusable
        return f"{type(e).__name__}: {e}"
    return None


def index_images(root: str, skip_bad_files: bool = False) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """Lists and checks every image under `root/<class>/`: an optional check before training.

    `ImageFolder` does not call it: it only lists the folder and checks each image as a loader worker reads it.
    Call this to find every unreadable file before a long run, at the cost of reading the whole folder first:
    up to 256 MiB every image is decoded (in threads), beyond that every header is read.

    Args:
        root: a folder with one sub-folder per class (hidden ones are ignored).
        skip_bad_files: leave unreadable images out (they are returned) rather than raise. Defaults to `False`.

    Returns:
        `(classes, files, skipped)`: class names, `(path, label)` pairs and the unreadable paths left out. Pass
        `files` to `ImageFolder(root, ..., files=files)` to train on the checked list.

    Raises:
        ValueError: for unreadable images (without `skip_bad_files`), or for fewer than two classes with images.
    """
    classes, files = _list_images(root)
    sizes = itertools.accumulate(os.path.getsize(path) for path, _ in files)
    decode = all(total <= _DECODE_CHECK_BYTES for total in sizes)  # stops at the first file past the limit
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # decoders release the GIL
        problems = list(pool.map(lambda item: _problem(item[0], decode), files))
    bad = [(path, why) for (path, _), why in zip(files, problems) if why]
    if bad and not skip_bad_files:
        shown = "; ".join(f"{path} ({why})" for path, why in bad[:3]) + ("; ..." if len(bad) > 3 else "")
        raise ValueError(f"{len(bad)} of {len(files)} image(s) under {root!r} cannot be read: {shown}. Replace or "
                         f"delete them, or pass --skip-bad-files (ImageFolder(skip_bad_files=True)) to train without "
                         f"them.")
    files = [item for item, why in zip(files, problems) if not why]
    _require_two_classes(root, classes, files, what="readable images")
    return classes, files, [path for path, _ in bad]


# NOTE [ Unreadable images are found as they are read ]
# Nothing before the first step costs more per image than one listing of each class folder: opening every file
# up front took 33 s for 300,000 small JPEGs, 18 minutes at 10^7. So `_load`, in the loader's workers, is where a
# bad file is met. Without skip_bad_files it raises, naming the file. With it, the next file in the list takes
# the bad one's place (in the same class folder, usually) rather than the batch coming back one shorter: batches
# keep one shape, so a compiled step is not traced again, ranks stay in step and shared-memory slots fit, and a
# batch of bad files cannot come back empty. The counts are this object's, in this process: each worker process
# holds its own copy, so each names its first few bad files and applies the cap to what it has read itself.


class ImageFolder(WorkerFormDataset):
    """Images under `root/<class>/*.{png,jpg,jpeg}`, decoded, resized and augmented in the loader's workers.

    Building one only lists the class folders: each image is opened when its batch is read. An image that
    cannot be decoded then raises a ValueError naming it, or, with `skip_bad_files`, is replaced by the next
    readable file (its neighbour in the same class folder, usually); each process names its first few on
    stderr, and raises once more than 10% of the images it has read (and more than 10) are unreadable. To check
    every file before training instead, pass `files` from `index_images`. With `augment`, each image gets a
    random horizontal flip and a random crop after 12.5% padding, drawn from (seed, epoch, index) so that every
    worker agrees. `set_epoch` reshuffles the samples.

    Args:
        root: a folder with one sub-folder per class (hidden ones are ignored).
        batch_size: images per batch.
        size: side of the square the images are resized to.
        augment: flip and crop at random. Defaults to `False`.
        seed: seed of the shuffle and the augmentation. Defaults to `0`.
        files: `(path, label)` pairs to use instead of listing `root` (a split, or `index_images`'s checked
            list). Defaults to `None`.
        skip_bad_files: replace unreadable images rather than raise. Defaults to `False`.
        **kwargs: `keras.utils.PyDataset`'s `workers`, `use_multiprocessing`, `max_queue_size`.

    Attributes:
        files_read: the image files this object has opened in this process, unreadable ones included.
        bad_files: `{path: why}` of the unreadable images this object has met in this process, in order.

    Raises:
        ValueError: for fewer than two class folders with images, or no images.

    Example:
        >>> folder = ImageFolder(write_sample("imgs", classes=2, per_class=4, size=8), batch_size=4, size=8)
        >>> folder.files_read
        0
        >>> images, labels = folder[0]
        >>> images.shape, folder.files_read
        ((4, 8, 8, 3), 4)
    """

    def __init__(self, root: str, batch_size: int, size: int, augment: bool = False, seed: int = 0,
                 files: list[tuple[str, int]] | None = None, skip_bad_files: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if files is None:
            self.classes, files = _list_images(root)
            _require_two_classes(root, self.classes, files)
        else:
            self.classes = _class_names(root)
        if not files:
            raise ValueError(f"ImageFolder found no {'/'.join(_EXTENSIONS)} files under {root!r}.")
        self._batches = ImageFiles(root, files, batch_size, size, augment, seed, skip_bad_files)

    @property
    def skipped(self) -> list[str]:
        """Deprecated: the unreadable paths met so far in this process; read `bad_files` instead."""
        warnings.warn("ImageFolder.skipped is deprecated: images are checked as they are read, not when the folder "
                      "is listed; read ImageFolder.bad_files (this process's finds so far), or call index_images "
                      "to check every file up front.", DeprecationWarning, stacklevel=2)
        return list(self.bad_files)

    # Views of the settings and this process's counters: the batches hold them, and the workers get the batches.
    files = property(lambda self: self._batches.files)
    root = property(lambda self: self._batches.root)
    batch_size = property(lambda self: self._batches.batch_size)
    size = property(lambda self: self._batches.size)
    augment = property(lambda self: self._batches.augment)
    seed = property(lambda self: self._batches.seed)
    skip_bad_files = property(lambda self: self._batches.skip_bad_files)
    files_read = property(lambda self: self._batches.files_read)
    bad_files = property(lambda self: self._batches.bad_files)
    epoch = property(lambda self: self._batches.epoch)
    order = property(lambda self: self._batches.order)

    def worker_dataset(self) -> ImageFiles:
        """The same batches without Keras (`kfast.data._image_files.ImageFiles`), for FastLoader's worker processes:
        they start without importing Keras or TensorFlow."""
        return self._batches



def write_sample(directory: str, classes: int = 4, per_class: int = 24, size: int = 32, seed: int = 0) -> str:
    """Writes `per_class` PNG images for each of `classes` classes under directory/<class>/."""
    from PIL import Image

    for label in range(classes):
        os.makedirs(os.path.join(directory, f"class_{label}"), exist_ok=True)
        for i in range(per_class):
            image = synthetic_image(label, classes, size, np.random.default_rng([seed, label, i]))
            Image.fromarray(image).save(os.path.join(directory, f"class_{label}", f"{i:04d}.png"))
    return directory


def model(size: int, classes: int) -> keras.Model:
    """A small ResNet: conv stem, two residual stages, global pooling."""

    def block(x: Any, filters: int, stride: int) -> Any:
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        y = keras.layers.BatchNormalization(momentum=0.9)(y)
        y = keras.layers.ReLU()(y)
        y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
        y = keras.layers.BatchNormalization(momentum=0.9)(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))

    inputs = keras.Input((size, size, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = block(x, 16, 1)
    x = block(x, 32, 2)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="small_resnet")


def build(args: argparse.Namespace) -> Recipe:
    from kfast import distributed
    from kfast.recipes import _common
    from kfast.recipes._packed import is_pack, packed_images

    if args.data and is_pack(args.data):
        train, val, classes = packed_images(args)
    elif args.data:
        folder = ImageFolder(args.data, args.batch_size, args.image_size)  # lists the folder, opens nothing
        if args.skip_bad_files and distributed.is_chief():
            print(f"--skip-bad-files: images that cannot be decoded are skipped as they are read (the next image "
                  f"takes its place); the loader's processes name the first few on stderr, and stop the run if more "
                  f"than {MAX_BAD_FRACTION:.0%} of the images one reads are unreadable.", flush=True)
        train_rows, val_rows = _common.split_rows(len(folder.files), args, fraction=0.2)
        train_files, val_files = [folder.files[i] for i in train_rows], [folder.files[i] for i in val_rows]
        skip = args.skip_bad_files
        train = ImageFolder(args.data, args.batch_size, args.image_size, augment=True, seed=args.seed,
                            files=train_files, skip_bad_files=skip)
        val = ImageFolder(args.data, args.batch_size, args.image_size, files=val_files, skip_bad_files=skip)
        classes = len(folder.classes)
    else:
        classes = args.classes
        train = SyntheticImages(args.samples, args.batch_size, args.image_size, classes, seed=args.seed)
        val_samples = max(args.batch_size * distributed.size(), args.samples // 8)  # a batch per rank at least
        val = SyntheticImages(val_samples, args.batch_size, args.image_size, classes, seed=args.seed + 1)
    return _common.assemble(model(args.image_size, classes), train, val, args)


def main(argv: Sequence[str] | None = None) -> None:
    from kfast.recipes._common import run

    run("image-classification", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
