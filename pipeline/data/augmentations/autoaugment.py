"""AutoAugment's ImageNet policy as tensorflow/tpu's EfficientNet input
applies it (`autoaugment.py`, policy "v0"; Cubuk et al. 2018): each image
gets one of 25 sub-policies at random, each two operations applied with
their own probabilities at fixed magnitudes (levels 0-10).

The operations are PIL's, written in TensorFlow ops on uint8 images as
tensorflow/tpu writes them: the same arguments per level, a random sign
for rotations, shears and translations, empty pixels of geometric ones
filled with grey (128). Translations are tensorflow/tpu's 250 px at level
10 on a 224 px image, scaled with the side here so a smaller stage of
progressive learning gets the same share.
"""

import math

import tensorflow as tf

MAX_LEVEL = 10.0
FILL = 128
_TRANSLATE_AT_224 = 250.0

# (operation, probability, level) pairs: tensorflow/tpu's policy_v0.
POLICY_V0 = (
    (('Equalize', 0.8, 1), ('ShearY', 0.8, 4)),
    (('Color', 0.4, 9), ('Equalize', 0.6, 3)),
    (('Color', 0.4, 1), ('Rotate', 0.6, 8)),
    (('Solarize', 0.8, 3), ('Equalize', 0.4, 7)),
    (('Solarize', 0.4, 2), ('Solarize', 0.6, 2)),
    (('Color', 0.2, 0), ('Equalize', 0.8, 8)),
    (('Equalize', 0.4, 8), ('SolarizeAdd', 0.8, 3)),
    (('ShearX', 0.2, 9), ('Rotate', 0.6, 8)),
    (('Color', 0.6, 1), ('Equalize', 1.0, 2)),
    (('Invert', 0.4, 9), ('Rotate', 0.6, 0)),
    (('Equalize', 1.0, 9), ('ShearY', 0.6, 3)),
    (('Color', 0.4, 7), ('Equalize', 0.6, 0)),
    (('Posterize', 0.4, 6), ('AutoContrast', 0.4, 7)),
    (('Solarize', 0.6, 8), ('Color', 0.6, 9)),
    (('Solarize', 0.2, 4), ('Rotate', 0.8, 9)),
    (('Rotate', 1.0, 7), ('TranslateY', 0.8, 9)),
    (('ShearX', 0.0, 0), ('Solarize', 0.8, 4)),
    (('ShearY', 0.8, 0), ('Color', 0.6, 4)),
    (('Color', 1.0, 0), ('Rotate', 0.6, 2)),
    (('Equalize', 0.8, 4), ('Equalize', 0.0, 8)),
    (('Equalize', 1.0, 4), ('AutoContrast', 0.6, 2)),
    (('ShearY', 0.4, 7), ('SolarizeAdd', 0.6, 7)),
    (('Posterize', 0.8, 2), ('Solarize', 0.6, 10)),
    (('Solarize', 0.6, 8), ('Equalize', 0.6, 1)),
    (('Color', 0.8, 6), ('Rotate', 0.4, 5)),
)


def _signed(value):
  """`value` or -`value`, at even odds."""
  return tf.where(tf.random.uniform([]) < 0.5, -value, value)


def _blend(degenerate, image, factor):
  """PIL's ImageEnhance: `degenerate` at 0, `image` at 1, extrapolated
  past it and clipped."""
  mixed = (tf.cast(degenerate, tf.float32) + factor *
           (tf.cast(image, tf.float32) - tf.cast(degenerate, tf.float32)))
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _transformed(image, transform):
  """`image` under the projective `transform` (8 numbers, output to input
  coordinates), nearest pixels, empty ones grey."""
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=tf.cast(transform, tf.float32)[None],
      output_shape=tf.shape(image)[:2], fill_value=float(FILL),
      interpolation='NEAREST', fill_mode='CONSTANT')[0]


def _rotate(image, degrees):
  height = tf.cast(tf.shape(image)[0], tf.float32)
  width = tf.cast(tf.shape(image)[1], tf.float32)
  angle = _signed(degrees * math.pi / 180.0)
  cos, sin = tf.cos(angle), tf.sin(angle)
  # About the centre: x' = cos x - sin y + dx, y' = sin x + cos y + dy.
  dx = ((width - 1) - (cos * (width - 1) - sin * (height - 1))) / 2
  dy = ((height - 1) - (sin * (width - 1) + cos * (height - 1))) / 2
  return _transformed(image, [cos, -sin, dx, sin, cos, dy, 0.0, 0.0])


def _equalize(image):
  """PIL's ImageOps.equalize, a channel at a time."""
  def channel(values):
    values = tf.cast(values, tf.int32)
    histogram = tf.histogram_fixed_width(values, [0, 255], nbins=256)
    nonzero = tf.boolean_mask(histogram, histogram > 0)
    step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
    safe = tf.maximum(step, 1)
    lut = tf.clip_by_value(
        tf.concat([[0], ((tf.cumsum(histogram) + safe // 2) // safe)[:-1]],
                  0), 0, 255)
    return tf.cast(tf.where(step == 0, values, tf.gather(lut, values)),
                   tf.uint8)
  return tf.stack([channel(image[..., c]) for c in range(3)], -1)


def _autocontrast(image):
  """PIL's ImageOps.autocontrast: each channel stretched to 0-255."""
  def channel(values):
    values = tf.cast(values, tf.float32)
    low, high = tf.reduce_min(values), tf.reduce_max(values)
    scale = 255.0 / tf.maximum(high - low, 1.0)
    stretched = tf.clip_by_value((values - low) * scale, 0.0, 255.0)
    return tf.cast(tf.where(high > low, stretched, values), tf.uint8)
  return tf.stack([channel(image[..., c]) for c in range(3)], -1)


def _operation(name, level, side):
  """The function of an image that `name` at `level` is."""
  share = level / MAX_LEVEL
  grey = lambda image: tf.image.grayscale_to_rgb(
      tf.image.rgb_to_grayscale(image))
  return {
      'AutoContrast': _autocontrast,
      'Equalize': _equalize,
      'Invert': lambda image: 255 - image,
      'Rotate': lambda image: _rotate(image, share * 30.0),
      # tensorflow/tpu's bits kept: 0 to 4 (its level 2 keeps none).
      'Posterize': lambda image: tf.bitwise.bitwise_and(
          image, tf.constant((0xFF << (8 - int(share * 4))) & 0xFF,
                             tf.uint8)),
      'Solarize': lambda image: tf.where(
          image < int(share * 256), image, 255 - image),
      'SolarizeAdd': lambda image: tf.where(
          image < 128, tf.cast(tf.clip_by_value(
              tf.cast(image, tf.int32) + int(share * 110), 0, 255),
                               tf.uint8), image),
      'Color': lambda image: _blend(grey(image), image, share * 1.8 + 0.1),
      'ShearX': lambda image: _transformed(
          image, [1.0, _signed(share * 0.3), 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
      'ShearY': lambda image: _transformed(
          image, [1.0, 0.0, 0.0, _signed(share * 0.3), 1.0, 0.0, 0.0, 0.0]),
      'TranslateY': lambda image: _transformed(
          image, [1.0, 0.0, 0.0, 0.0, 1.0,
                  _signed(share * _TRANSLATE_AT_224 * side / 224), 0.0, 0.0]),
  }[name]


def policy_v0(size):
  """A function of a [size, size, 3] uint8 image: one sub-policy of
  POLICY_V0 drawn at random, each of its operations applied with its
  probability."""
  def sub_policy(operations):
    def apply(image):
      for name, probability, level in operations:
        operation = _operation(name, level, size)
        image = tf.cond(tf.random.uniform([]) < probability,
                        lambda op=operation, im=image: op(im),
                        lambda im=image: im)
      return image
    return apply

  branches = [sub_policy(operations) for operations in POLICY_V0]

  def augment(image):
    chosen = tf.random.uniform([], maxval=len(branches), dtype=tf.int32)
    return tf.ensure_shape(tf.switch_case(
        chosen, [lambda b=branch: b(image) for branch in branches]),
                           (size, size, 3))
  return augment
