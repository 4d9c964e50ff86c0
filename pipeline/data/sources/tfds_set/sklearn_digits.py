"""scikit-learn's handwritten digits as a tensorflow-datasets builder.

The offline default data set: 1,797 real 8x8 grayscale digits that ship inside
scikit-learn, so a fresh machine with no internet trains for real, through the
same tfds code path as any other data set. Importing this module registers
the builder as `sklearn_digits`.
"""

import numpy as np
import tensorflow_datasets as tfds

_TEST_FRACTION = 0.2
_SPLIT_SEED = 0


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
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    # Pixel values are 0..16; spread them over uint8's range.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    order = np.random.RandomState(_SPLIT_SEED).permutation(len(images))
    num_test = int(len(images) * _TEST_FRACTION)
    test, train = order[:num_test], order[num_test:]
    return {
        'train': self._generate_examples(images[train], digits.target[train],
                                         train),
        'test': self._generate_examples(images[test], digits.target[test],
                                        test),
    }

  def _generate_examples(self, images, labels, keys):
    for image, label, key in zip(images, labels, keys):
      yield int(key), {'image': image[..., None], 'label': int(label)}
