"""A set of colour photographs of ImageNet-like size, made offline.

Input throughput depends on what is decoded: 8x8 digits re-encoded as JPEG
decode in microseconds and say nothing about ImageNet. scikit-learn ships two
427x640 colour photographs; random crops of them (shorter side 300-427 px,
landscape and portrait, aspect up to 3:2), flipped, with brightness and
saturation jitter, re-encoded at JPEG quality 80-95, come out at about the
size and compression of ImageNet's training JPEGs (mean 400x350 px, about
110 KiB; these: see BUILD_NOTES.md). Labels are arbitrary (i mod classes):
the set is for measuring input, not accuracy.
"""

import os

import numpy as np
import tensorflow as tf

from pipeline.data.sources.tfrecord import records as tfrecords


def _photographs():
  import sklearn.datasets  # pylint: disable=g-import-not-at-top
  folder = os.path.join(os.path.dirname(sklearn.datasets.__file__), 'images')
  return [tf.io.decode_jpeg(tf.io.read_file(os.path.join(folder, name)))
          for name in ('china.jpg', 'flower.jpg')]


def make_jpegs(num_images, seed=0):
  """`num_images` encoded JPEGs (bytes), reproducible from `seed`."""
  rng = np.random.default_rng(seed)
  photographs = _photographs()
  for _ in range(num_images):
    photo = photographs[rng.integers(len(photographs))]
    height, width = photo.shape[:2]
    short = int(rng.integers(300, min(height, width) + 1))
    long = int(rng.integers(short, min(int(short * 1.5), width) + 1))
    crop_height, crop_width = ((short, long) if rng.random() < 0.8 or
                               long > height else (long, short))
    top = int(rng.integers(height - crop_height + 1))
    left = int(rng.integers(width - crop_width + 1))
    image = photo[top:top + crop_height, left:left + crop_width]
    if rng.random() < 0.5:
      image = image[:, ::-1]
    image = tf.image.adjust_saturation(image, rng.uniform(0.6, 1.4))
    image = tf.image.adjust_brightness(image, rng.uniform(-0.15, 0.15))
    yield tf.io.encode_jpeg(image, quality=int(rng.integers(80, 96))).numpy()


def write(output_prefix, num_images, num_files, num_classes=10, seed=0,
          transform=lambda examples: examples):
  """Writes the set as TFRecord files `{prefix}-0000i-of-0000n`, each
  (image, label) pair through `transform` (a resize); returns the mean
  encoded size in bytes of what was written."""
  sizes = []

  def labelled():
    for index, encoded in enumerate(make_jpegs(num_images, seed)):
      yield encoded, index % num_classes

  def measured(examples):
    for encoded, label in examples:
      sizes.append(len(encoded))
      yield encoded, label

  tfrecords.write_shards(output_prefix, num_files,
                         measured(transform(labelled())))
  return sum(sizes) / max(num_images, 1)
