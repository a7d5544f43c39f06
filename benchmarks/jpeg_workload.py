"""W4 for the loader benchmarks: JPEG decoding and augmentation, the input work of image classifiers.

The benchmark makes its own images (no download): a few hundred smooth, textured pictures encoded as
JPEG at quality 90, kept in memory as bytes. A batch decodes 64 of them with Pillow, crops a 224x224
window at a position drawn from the batch index and flips half of the crops left to right. The same
work is available as a native tf.data pipeline (`tf.io.decode_jpeg` in a parallel map), with the same
images, crops and flips.
"""

import io

import keras
import numpy as np
from PIL import Image

BATCH = 64
CROP = 224
IMAGE_HW = (256, 320)
NUM_IMAGES = 256
NUM_CLASSES = 10


def make_jpegs(count=NUM_IMAGES, size=IMAGE_HW, seed=0):
    """`count` JPEG-encoded RGB pictures of `size` (height, width): waves plus noise, like photo texture."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size[0], 0:size[1]].astype(np.float32)
    encoded = []
    for k in range(count):
        a, b, c = rng.uniform(0.01, 0.08, 3)
        rgb = np.stack([np.sin(xx * a + k), np.cos(yy * b - k), np.sin((xx + yy) * c)], axis=-1) * 80 + 128
        rgb += rng.normal(0, 12, rgb.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        encoded.append(buf.getvalue())
    return encoded


def augmentation(index, n_images, size=IMAGE_HW):
    """Batch `index`'s image numbers, crop corners and flips: a pure function of the index."""
    rng = np.random.default_rng([7, index])
    images = (index * BATCH + np.arange(BATCH)) % n_images
    tops = rng.integers(0, size[0] - CROP + 1, BATCH)
    lefts = rng.integers(0, size[1] - CROP + 1, BATCH)
    flips = rng.random(BATCH) < 0.5
    return images, tops, lefts, flips


class JpegBatches(keras.utils.PyDataset):
    """W4: `n` batches of 64 decoded, cropped and flipped JPEGs (uint8) with int32 labels."""

    def __init__(self, n, jpegs=None, **kwargs):
        super().__init__(**kwargs)
        self.n = n
        self.jpegs = make_jpegs() if jpegs is None else jpegs

    def __len__(self):
        return self.n

    def _decode(self, index, out):
        if not 0 <= index < self.n:
            raise IndexError(index)
        images, tops, lefts, flips = augmentation(index, len(self.jpegs))
        for j, (k, top, left, flip) in enumerate(zip(images, tops, lefts, flips)):
            img = Image.open(io.BytesIO(self.jpegs[k])).crop((left, top, left + CROP, top + CROP))
            if flip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            out[j] = np.asarray(img)
        return (images % NUM_CLASSES).astype(np.int32)

    def __getitem__(self, index):
        x = np.empty((BATCH, CROP, CROP, 3), np.uint8)
        return x, self._decode(index, x)

    def fill_batch(self, index, out):
        x, y = out
        y[:] = self._decode(index, x)


def tf_native(ds):
    """The same batches as `ds` from tf.data: `decode_jpeg`, crop and flip in a parallel map, then batch."""
    import tensorflow as tf

    parts = [augmentation(i, len(ds.jpegs)) for i in range(len(ds))]
    images, tops, lefts, flips = (np.concatenate(p) for p in zip(*parts))
    encoded = tf.constant(ds.jpegs)

    def load(k, top, left, flip):
        img = tf.io.decode_jpeg(tf.gather(encoded, k), channels=3, dct_method="INTEGER_ACCURATE")
        img = tf.image.crop_to_bounding_box(img, top, left, CROP, CROP)
        img = tf.cond(flip, lambda: tf.image.flip_left_right(img), lambda: img)
        return img, tf.cast(k % NUM_CLASSES, tf.int32)

    data = tf.data.Dataset.from_tensor_slices((images.astype(np.int64), tops.astype(np.int32), lefts.astype(np.int32), flips))
    data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
    return data.prefetch(tf.data.AUTOTUNE)
