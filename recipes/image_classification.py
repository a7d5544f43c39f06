"""image-classification: a small ResNet-style CNN on an image folder or on generated images.

    kfast train image-classification                       # synthetic images
    kfast train image-classification --make-sample imgs    # write a small PNG folder
    kfast train image-classification --data imgs           # one sub-folder per class, JPEG or PNG
    kfast train image-classification --data imgs --skip-bad-files   # train without unreadable images
    horovodrun -np 2 python recipes/image_classification.py --epochs 3
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from typing import Any

import keras
import numpy as np

if TYPE_CHECKING:
    import argparse

    from PIL.Image import Image as PILImage

    from kfast.recipes._common import Recipe

SUMMARY = "ResNet-style CNN on an image folder (one sub-folder per class) or synthetic images"
_EXTENSIONS = (".png", ".jpg", ".jpeg")
# Folders up to this size are fully decoded when indexed; larger ones only have their headers read, so a
# file broken past its header fails (naming its path) in a loader worker instead.
_DECODE_CHECK_BYTES = 256 * 2**20
_reported_bad: set[str] = set()  # unreadable files this process has reported already


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=3, batch_size=32, lr=1e-3)
    parser.add_argument("--image-size", type=int, default=32, help="side of the square input (default 32)")
    parser.add_argument("--classes", type=int, default=4, help="classes of synthetic data (default 4)")
    parser.add_argument("--samples", type=int, default=1024, help="synthetic training images (default 1024)")
    parser.add_argument("--skip-bad-files", action="store_true",
                        help="skip images that cannot be decoded (and say how many) instead of stopping")


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


def to_rgb(img: PILImage, path: str) -> PILImage:
    """Returns PIL image `img` (read from `path`) as 8-bit RGB, scaling deeper pixels rather than clipping them.

    Integer images of 16 bits or more (modes `I;16`, which 16-bit grayscale PNGs open as, and `I`) map
    0..65535 onto 0..255; float images (mode `F`) map 0..1, or 0..255 if a pixel exceeds 1. Images with
    transparency go through RGBA, and alpha is dropped, as Keras's `load_img` does.

    Raises:
        ValueError: for pixels outside those ranges (or NaN), naming `path`.
    """
    from PIL import Image

    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        pixels = np.asarray(img, dtype=np.float64)
        full = 65535.0
        if img.mode == "F":
            full = 1.0 if pixels.size and pixels.max() <= 1 else 255.0
        if pixels.size and not (np.isfinite(pixels).all() and pixels.min() >= 0 and pixels.max() <= full):
            raise ValueError(f"{path} is a mode-{img.mode} image with pixels in [{pixels.min():g}, {pixels.max():g}]; "
                             f"expected 0..{full:g}. Rescale it to 8-bit (0..255) and save it again.")
        return Image.fromarray(np.rint(pixels * (255 / full)).astype(np.uint8)).convert("RGB")
    if "transparency" in img.info:
        img = img.convert("RGBA")  # converting palette images straight to RGB warns when entries carry alpha
    return img.convert("RGB")


def _class_names(root: str) -> list[str]:
    # Hidden folders (.ipynb_checkpoints, .DS_Store's kin) are not classes.
    return sorted(d for d in os.listdir(root) if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))


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
    """Lists and checks the images under `root/<class>/`.

    Folders up to 256 MiB are decoded in full (in threads), larger ones have every header read, so that a
    broken image stops the run before training starts, naming the file.

    Args:
        root: a folder with one sub-folder per class (hidden ones are ignored).
        skip_bad_files: leave unreadable images out (they are returned) rather than raise. Defaults to `False`.

    Returns:
        `(classes, files, skipped)`: class names, `(path, label)` pairs and the unreadable paths left out.

    Raises:
        ValueError: for unreadable images (without `skip_bad_files`), or for fewer than two classes with images.
    """
    classes = _class_names(root)
    files = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
             for f in sorted(os.listdir(os.path.join(root, c))) if f.lower().endswith(_EXTENSIONS)]
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
    found = sorted({classes[label] for _, label in files})
    if len(found) < 2:
        raise ValueError(f"ImageFolder found readable images in {len(found)} class folder(s) under {root!r}"
                         f"{': ' + ', '.join(found) if found else ''}; a classifier needs at least two. Put each "
                         f"class's images in its own sub-folder: {root}/<class>/<image>.png.")
    return classes, files, [path for path, _ in bad]


class ImageFolder(keras.utils.PyDataset):
    """Images under `root/<class>/*.{png,jpg,jpeg}`, decoded, resized and augmented in the loader's workers.

    The files are checked when the folder is indexed (see `index_images`). With `augment`, each image gets a
    random horizontal flip and a random crop after 12.5% padding, drawn from (seed, epoch, index) so that
    every worker agrees. `set_epoch` reshuffles the samples. An image that fails to decode in a worker
    raises a ValueError naming it, or, with `skip_bad_files`, is replaced by the next readable file (its
    neighbour in the same class folder, usually) and reported once per process.

    Attributes:
        skipped: the unreadable paths left out (with `skip_bad_files`).
    """

    def __init__(self, root: str, batch_size: int, size: int, augment: bool = False, seed: int = 0,
                 files: list[tuple[str, int]] | None = None, skip_bad_files: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if files is None:
            self.classes, files, self.skipped = index_images(root, skip_bad_files)
        else:
            self.classes, self.skipped = _class_names(root), []
        if not files:
            raise ValueError(f"ImageFolder found no {'/'.join(_EXTENSIONS)} files under {root!r}.")
        self.files, self.skip_bad_files = files, skip_bad_files
        self.root, self.batch_size, self.size, self.augment, self.seed = root, batch_size, size, augment, seed
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def __len__(self) -> int:
        return -(-len(self.files) // self.batch_size)

    def _decode(self, path: str) -> np.ndarray:
        from PIL import Image

        with Image.open(path) as img:
            return np.asarray(to_rgb(img, path).resize((self.size, self.size)), dtype=np.uint8)

    def _load(self, i: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """File i (or, with skip_bad_files, the next one that decodes), decoded and augmented, and its label."""
        for step in range(len(self.files)):
            path, label = self.files[(i + step) % len(self.files)]
            try:
                image = self._decode(path)
                break
            except Exception as e:  # noqa: BLE001 - re-raised naming the file, original chained
                why = f"{type(e).__name__}: {e}"
                if not self.skip_bad_files:
                    raise ValueError(f"ImageFolder cannot decode {path} ({why}); replace or delete it, or pass "
                                     f"--skip-bad-files (ImageFolder(skip_bad_files=True)) to train without it.") from e
                if path not in _reported_bad:
                    _reported_bad.add(path)
                    print(f"--skip-bad-files: cannot decode {path} ({why}); the next image takes its place.",
                          file=sys.stderr, flush=True)
        else:
            raise ValueError(f"ImageFolder could decode none of its {len(self.files)} images under {self.root!r}.")
        if self.augment:
            if rng.random() < 0.5:
                image = image[:, ::-1]
            pad = self.size // 8
            padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
            top, left = rng.integers(0, 2 * pad + 1, size=2)
            image = padded[top:top + self.size, left:left + self.size]
        return image, label

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        picks = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        rng = np.random.default_rng([self.seed, self.epoch, index])
        images, labels = zip(*(self._load(i, rng) for i in picks))
        return np.stack(images), np.array(labels, dtype="int32")


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

    if args.data:
        folder = ImageFolder(args.data, args.batch_size, args.image_size, skip_bad_files=args.skip_bad_files)
        if folder.skipped and distributed.is_chief():
            shown = ", ".join(folder.skipped[:3]) + (", ..." if len(folder.skipped) > 3 else "")
            print(f"--skip-bad-files: skipped {len(folder.skipped)} of {len(folder.skipped) + len(folder.files)} "
                  f"image(s) that cannot be read: {shown}", flush=True)
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
