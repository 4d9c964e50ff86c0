"""scikit-learn's handwritten digits as tensorflow-datasets builders.

`sklearn_digits`, the offline default data set: 1,797 real 8x8 grayscale
digits that ship inside scikit-learn, so a fresh machine with no internet
trains for real, through the same tfds code path as any other data set.

`scattered_digits`: the same digits, each three times, at a random size
(10-60 px) and place on a 64 px canvas, the test split made of the test
digits alone. A set where resolution matters (a digit under 16 px loses
strokes at 32 px) and objects come at many scales, as random-resized crops
of photographs make them, so a network trained at one size carries to
another: progressive learning's time to accuracy can be measured offline on
it (BUILD_NOTES). `scattered_digits128`: the same at 10-120 px on a 128 px
canvas, where the smallest digits need the whole 128 px, and a 128 px step
costs five 64 px ones, so stages at smaller sizes have the most to save.
Reproducible from fixed seeds.

Importing this module registers the three builders.
"""

import numpy as np
import tensorflow_datasets as tfds

_TEST_FRACTION = 0.2
_SPLIT_SEED = 0


def splits():
  """{'train'|'test': (uint8 images [n, 8, 8], labels, keys)}: the fixed
  80/20 split, by a seeded permutation."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  # Pixel values are 0..16; spread them over uint8's range.
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  order = np.random.RandomState(_SPLIT_SEED).permutation(len(images))
  num_test = int(len(images) * _TEST_FRACTION)
  test, train = order[:num_test], order[num_test:]
  return {'train': (images[train], digits.target[train], train),
          'test': (images[test], digits.target[test], test)}


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
  """8x8 handwritten digits, 10 classes; fixed 80/20 train/test split."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First release.'}

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://scikit-learn.org/stable/datasets/toy_dataset.html',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with scikit-learn.
    return {split: self._generate_examples(*arrays)
            for split, arrays in splits().items()}

  def _generate_examples(self, images, labels, keys):
    for image, label, key in zip(images, labels, keys):
      yield int(key), {'image': image[..., None], 'label': int(label)}


SCATTERED_COPIES = 3
_SCATTER_SEEDS = {'train': 1, 'test': 2}


def scatter(images, seed, canvas, sizes):
  """uint8 [copies * n, canvas, canvas, 1]: each 8x8 image
  `SCATTERED_COPIES` times (copy-major), scaled bilinearly to a side drawn
  from `sizes` (px, both included) and placed at a random spot on a black
  canvas."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  low, high = sizes
  out = np.zeros((SCATTERED_COPIES * len(images), canvas, canvas, 1),
                 np.uint8)
  for i, image in enumerate(np.tile(images, (SCATTERED_COPIES, 1, 1))):
    side = int(rng.integers(low, high + 1))
    top, left = rng.integers(0, canvas - side + 1, size=2)
    scaled = tf.image.resize(image[..., None], (side, side), 'bilinear')
    out[i, top:top + side, left:left + side] = np.round(
        np.clip(scaled.numpy(), 0, 255))
  return out


class ScatteredDigits(tfds.core.GeneratorBasedBuilder):
  """The digits at 10-60 px anywhere on a 64 px canvas, three of each;
  4,314 train, 1,077 test (from the test digits alone)."""

  CANVAS = 64
  SIZES = (10, 60)  # The digit's side on the canvas, px.
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First release.'}

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(
                shape=(self.CANVAS, self.CANVAS, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://scikit-learn.org/stable/datasets/toy_dataset.html',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with scikit-learn.
    generators = {}
    for split, (images, labels, _) in splits().items():
      generators[split] = self._generate_examples(
          scatter(images, _SCATTER_SEEDS[split], self.CANVAS, self.SIZES),
          np.tile(labels, SCATTERED_COPIES))
    return generators

  def _generate_examples(self, images, labels):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {'image': image, 'label': int(label)}


class ScatteredDigits128(ScatteredDigits):
  """The digits at 10-120 px anywhere on a 128 px canvas, three of each;
  the splits as scattered_digits'."""

  CANVAS = 128
  SIZES = (10, 120)


# The builders' names (tfds derives each from its class): all prepare from
# scikit-learn, nothing downloaded.
BUNDLED = (SklearnDigits.name, ScatteredDigits.name, ScatteredDigits128.name)
