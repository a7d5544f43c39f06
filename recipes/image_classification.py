"""image-classification: a small ResNet-style CNN on an image folder or on generated images.

    kfast train image-classification                       # synthetic images
    kfast train image-classification --make-sample imgs    # write a small PNG folder
    kfast train image-classification --data imgs           # one sub-folder per class, JPEG or PNG
    horovodrun -np 2 python recipes/image_classification.py --epochs 3
"""

import os
import sys

import keras
import numpy as np

SUMMARY = "ResNet-style CNN on an image folder (one sub-folder per class) or synthetic images"
_EXTENSIONS = (".png", ".jpg", ".jpeg")


def add_arguments(parser):
    from kfast.recipes._common import add_common_arguments

    add_common_arguments(parser, epochs=3, batch_size=32, lr=1e-3)
    parser.add_argument("--image-size", type=int, default=32, help="side of the square input (default 32)")
    parser.add_argument("--classes", type=int, default=4, help="classes of synthetic data (default 4)")
    parser.add_argument("--samples", type=int, default=1024, help="synthetic training images (default 1024)")


def synthetic_image(label, classes, size, rng):
    """A learnable image: a bright square whose position encodes the class, on noise."""
    image = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    cell = size // 2
    row, col = divmod(label % 4, 2)
    image[row * cell:(row + 1) * cell, col * cell:(col + 1) * cell, label % 3] = 255
    return image


class SyntheticImages(keras.utils.PyDataset):
    """`samples` generated images in batches; image i is a pure function of (seed, i)."""

    def __init__(self, samples, batch_size, size, classes, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.samples, self.batch_size, self.size, self.classes, self.seed = samples, batch_size, size, classes, seed

    def __len__(self):
        return -(-self.samples // self.batch_size)

    def __getitem__(self, index):
        ids = range(index * self.batch_size, min(self.samples, (index + 1) * self.batch_size))
        labels = np.array([i % self.classes for i in ids], dtype="int32")
        images = np.stack([synthetic_image(label, self.classes, self.size, np.random.default_rng([self.seed, i]))
                           for i, label in zip(ids, labels)])
        return images, labels


class ImageFolder(keras.utils.PyDataset):
    """Images under `root/<class>/*.{png,jpg,jpeg}`, decoded, resized and augmented in the loader's workers.

    With `augment`, each image gets a random horizontal flip and a random crop after 12.5% padding,
    drawn from (seed, epoch, index) so that every worker agrees. `set_epoch` reshuffles the samples.
    """

    def __init__(self, root, batch_size, size, augment=False, seed=0, files=None, **kwargs):
        super().__init__(**kwargs)
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if not self.classes:
            raise ValueError(f"ImageFolder found no class sub-folders in {root!r}; expected {root}/<class>/<image>.png")
        self.files = files if files is not None else [
            (os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
            for f in sorted(os.listdir(os.path.join(root, c))) if f.lower().endswith(_EXTENSIONS)]
        if not self.files:
            raise ValueError(f"ImageFolder found no {'/'.join(_EXTENSIONS)} files under {root!r}.")
        self.root, self.batch_size, self.size, self.augment, self.seed = root, batch_size, size, augment, seed
        self.set_epoch(0)

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))

    def __len__(self):
        return -(-len(self.files) // self.batch_size)

    def _load(self, path, rng):
        from PIL import Image

        with Image.open(path) as img:
            image = np.asarray(img.convert("RGB").resize((self.size, self.size)), dtype=np.uint8)
        if self.augment:
            if rng.random() < 0.5:
                image = image[:, ::-1]
            pad = self.size // 8
            padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
            top, left = rng.integers(0, 2 * pad + 1, size=2)
            image = padded[top:top + self.size, left:left + self.size]
        return image

    def __getitem__(self, index):
        picks = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        rng = np.random.default_rng([self.seed, self.epoch, index])
        images = np.stack([self._load(self.files[i][0], rng) for i in picks])
        return images, np.array([self.files[i][1] for i in picks], dtype="int32")


def split(folder, val_fraction=0.2, seed=0):
    """Splits an ImageFolder's files into training and validation folders of the same classes."""
    order = np.random.default_rng(seed).permutation(len(folder.files))
    n_val = max(1, int(len(order) * val_fraction))
    val = [folder.files[i] for i in order[:n_val]]
    train = [folder.files[i] for i in order[n_val:]]
    return train, val


def write_sample(directory, classes=4, per_class=24, size=32, seed=0):
    """Writes `per_class` PNG images for each of `classes` classes under directory/<class>/."""
    from PIL import Image

    for label in range(classes):
        os.makedirs(os.path.join(directory, f"class_{label}"), exist_ok=True)
        for i in range(per_class):
            image = synthetic_image(label, classes, size, np.random.default_rng([seed, label, i]))
            Image.fromarray(image).save(os.path.join(directory, f"class_{label}", f"{i:04d}.png"))
    return directory


def model(size, classes):
    """A small ResNet: conv stem, two residual stages, global pooling."""

    def block(x, filters, stride):
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


def build(args):
    from kfast import distributed
    from kfast.recipes import _common

    if args.data:
        folder = ImageFolder(args.data, args.batch_size, args.image_size)
        train_files, val_files = split(folder, seed=args.seed)
        train = ImageFolder(args.data, args.batch_size, args.image_size, augment=True, seed=args.seed, files=train_files)
        val = ImageFolder(args.data, args.batch_size, args.image_size, files=val_files)
        classes = len(folder.classes)
    else:
        classes = args.classes
        train = SyntheticImages(args.samples, args.batch_size, args.image_size, classes, seed=args.seed)
        val_samples = max(args.batch_size * distributed.size(), args.samples // 8)  # a batch per rank at least
        val = SyntheticImages(val_samples, args.batch_size, args.image_size, classes, seed=args.seed + 1)
    return _common.assemble(model(args.image_size, classes), train, val, args)


def main(argv=None):
    from kfast.recipes import run

    run("image-classification", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
