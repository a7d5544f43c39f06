"""The image recipe's batches without Keras: images under class folders, decoded, resized and augmented, for
FastLoader's worker processes (`ImageFolder.worker_dataset()` in `kfast.recipes.image_classification`), which then
start without importing Keras or TensorFlow. Imports numpy and Pillow only."""

from __future__ import annotations

import itertools
import os
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

# With skip_bad_files, a process stops once more than _BAD_FILES_ALLOWED of the images it has read, and more than
# MAX_BAD_FRACTION of them, could not be decoded: that many is a wrong folder or a broken copy, not a few bad files.
MAX_BAD_FRACTION = 0.1
_BAD_FILES_ALLOWED = 10
_BAD_FILES_NAMED = 5  # each process names this many on stderr, then gives the count at each doubling


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



class ImageFiles:
    """The batches of `ImageFolder` (see there): `files` `(path, label)` in an order shuffled per epoch by `seed`,
    each image decoded when its batch is read; the counters `files_read` and `bad_files` are this process's."""

    def __init__(self, root: str, files: list[tuple[str, int]], batch_size: int, size: int, augment: bool, seed: int,
                 skip_bad_files: bool) -> None:
        self.files, self.skip_bad_files = files, skip_bad_files
        self.root, self.batch_size, self.size, self.augment, self.seed = root, batch_size, size, augment, seed
        self.files_read = 0
        self.bad_files: dict[str, str] = {}
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Selects epoch `epoch`'s order of the files."""
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def __len__(self) -> int:
        return -(-len(self.files) // self.batch_size)

    def _decode(self, path: str) -> np.ndarray:
        from PIL import Image

        with Image.open(path) as img:
            return np.asarray(to_rgb(img, path).resize((self.size, self.size)), dtype=np.uint8)

    def _skip(self, path: str, why: str) -> None:
        """Counts unreadable `path`, names it if it is among this process's first few, and applies the cap."""
        if path in self.bad_files:
            return
        self.bad_files[path] = why
        bad, read, pid = len(self.bad_files), self.files_read, os.getpid()
        if bad > max(_BAD_FILES_ALLOWED, MAX_BAD_FRACTION * read):
            shown = "; ".join(f"{p} ({w})" for p, w in itertools.islice(self.bad_files.items(), 3))
            raise ValueError(f"--skip-bad-files: {bad} of the {read} images process {pid} read under {self.root!r} "
                             f"cannot be decoded (more than {MAX_BAD_FRACTION:.0%}), among them {shown}. That many "
                             f"is more likely a wrong folder or a broken copy than a few bad files: check the folder "
                             f"(kfast.recipes.image_classification.index_images lists every unreadable file).")
        count = f"{bad} unreadable of {read} images read by process {pid} so far"
        if bad <= _BAD_FILES_NAMED:
            more = "; further ones are counted, not named" if bad == _BAD_FILES_NAMED else ""
            print(f"--skip-bad-files: cannot decode {path} ({why}); the next image takes its place ({count}{more}).",
                  file=sys.stderr, flush=True)
        elif bad & (bad - 1) == 0:  # a power of two: a few lines however many there are
            print(f"--skip-bad-files: {count}.", file=sys.stderr, flush=True)

    def _load(self, i: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """File i (or, with skip_bad_files, the next one that decodes), decoded and augmented, and its label."""
        for step in range(len(self.files)):
            path, label = self.files[(i + step) % len(self.files)]
            self.files_read += 1
            try:
                image = self._decode(path)
                break
            except Exception as e:  # noqa: BLE001 - re-raised naming the file, original chained
                why = f"{type(e).__name__}: {e}"
                if not self.skip_bad_files:
                    raise ValueError(f"ImageFolder cannot decode {path} ({why}); replace or delete it, or pass "
                                     f"--skip-bad-files (ImageFolder(skip_bad_files=True)) to train without it.") from e
                self._skip(path, why)
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
