"""The random training transforms config.augment names, each one object in
AUGMENTATIONS: what it does to an image, as parts both input pipelines
implement (tf_data.py here, on tf.data, with RandAugment's operations in
autoaugment.py; dali/ on DALI), so no module compares an augmentation's
name.

A new augmentation is a line below where it combines these parts; a new
part is a field here and its few lines in tf_data.py and dali/.
Imports no TensorFlow.
"""

import dataclasses

from pipeline import parts
from pipeline.errors import UserError

AUGMENTATIONS = parts.Table(
    'augmentation', 'augment',
    left_open=('', "the source's own: inception for photographs, translate "
               'for digits'))

# RandAugment's magnitude is on the paper's scale (Cubuk et al. 2019), 0 to
# 30, as DALI's bins and EfficientNetV2's settings (5 to 15) give it; Keras'
# layer takes it as a factor of the largest.
MAX_MAGNITUDE = 30
RANDAUGMENT_KEYS = {
    'randaugment_layers': parts.Key('inception_randaugment: operations '
                                    'applied to each image (1-10)'),
    'randaugment_magnitude': parts.Key(
        f'inception_randaugment: their strength, 0-{MAX_MAGNITUDE} (15 is '
        "Keras' factor 0.5)"),
}


@dataclasses.dataclass(frozen=True)
class RandAugment:
  """How many RandAugment operations each image gets, and how strong."""
  layers: int
  magnitude: float  # 0 to MAX_MAGNITUDE.

  @property
  def factor(self):
    """The magnitude as Keras' RandAugment takes it, 0 to 1."""
    return self.magnitude / MAX_MAGNITUDE


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
  # RandAugment's operations (randaugment_layers of randaugment_magnitude).
  randaugment: bool = False
  # AutoAugment's ImageNet policy, tensorflow/tpu's v0 (autoaugment.py).
  autoaugment: bool = False

  @property
  def keys(self):
    return RANDAUGMENT_KEYS if self.randaugment else {}

  def check(self, settings):
    if not self.randaugment:
      return
    layers = settings.randaugment_layers
    magnitude = settings.randaugment_magnitude
    if not (isinstance(layers, int) and 1 <= layers <= 10):
      raise UserError(f'randaugment_layers={layers!r}: expected 1 to 10 '
                      'operations an image')
    if not 0 <= magnitude <= MAX_MAGNITUDE:
      raise UserError(f'randaugment_magnitude={magnitude!r}: expected 0 to '
                      f'{MAX_MAGNITUDE} (the paper\'s scale)')

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
    Augmentation('inception_randaugment', 'inception, then RandAugment '
                 '(randaugment_layers operations of randaugment_magnitude)',
                 inception_crop=True, flips=True, randaugment=True),
    Augmentation('inception_autoaugment', "inception, then tensorflow/tpu's "
                 'AutoAugment policy v0 (tf.data only)', inception_crop=True,
                 flips=True, autoaugment=True),
):
  AUGMENTATIONS.register(_augmentation)

