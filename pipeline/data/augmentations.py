"""The random training transforms config.augment names, each one object in
AUGMENTATIONS: what it does to an image, as parts both input pipelines
implement (augment.py on tf.data, dali.py on DALI), so no module compares
an augmentation's name.

A new augmentation is a line below where it combines these parts; a new
part is a field here and its few lines in augment.py and dali.py.
Imports no TensorFlow.
"""

import dataclasses

from pipeline import parts

AUGMENTATIONS = parts.Table('augmentation', 'augment')


@dataclasses.dataclass(frozen=True, eq=False)
class Augmentation(parts.Part):
  """A training transform, as the parts it is made of, in this order."""
  name: str
  description: str
  # A random shift by up to an eighth of the side (the image padded).
  translates: bool = False
  # tensorflow/tpu's random resized crop (a random window of 8-100% of the
  # area, aspect 3/4-4/3, resized to the side), decoded from the crop alone
  # where the cache holds no image; evaluation then takes the central 87.5%.
  inception_crop: bool = False
  flips: bool = False  # Left and right, at random.
  randaugment: bool = False  # Two RandAugment operations of magnitude 0.5.
  keys = {}

  @property
  def central_fraction(self):
    """The share of each side evaluation crops to, centred."""
    return CENTRAL_FRACTION if self.inception_crop else 1.0

  @property
  def cached_aspect(self):
    """The width over height of what a decoded cache keeps of an image: the
    crop windows' widest, or square."""
    return 4 / 3 if self.inception_crop else 1.0


# tensorflow/tpu's evaluation crop, for images trained on inception crops.
CENTRAL_FRACTION = 0.875

for _augmentation in (
    Augmentation('none', 'no random transform'),
    Augmentation('translate', 'a random shift by up to 1/8 of the side',
                 translates=True),
    Augmentation('translate_flip', 'a random shift, then a random left-right '
                 'flip (not for digits: a mirrored 2 is no 2)',
                 translates=True, flips=True),
    Augmentation('inception', "tensorflow/tpu's ImageNet input: a random "
                 'resized crop and a flip; evaluation takes the central 87.5%',
                 inception_crop=True, flips=True),
    Augmentation('inception_randaugment', 'inception, then RandAugment (two '
                 'operations of magnitude 0.5)', inception_crop=True,
                 flips=True, randaugment=True),
):
  AUGMENTATIONS.register(_augmentation)


def of(config):
  """The Augmentation config.augment names."""
  return AUGMENTATIONS.of(config)
