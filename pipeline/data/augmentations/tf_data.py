"""Random training transforms: per image (translations, inception crops,
flips, RandAugment) and per batch (mixup, CutMix). They run after the cache,
so every epoch draws anew (augmenting before it would freeze the first
epoch's crops)."""

import keras
import tensorflow as tf

from pipeline.data import decode
from pipeline.data.augmentations import autoaugment


def augmenter(augmentation, size, crop, randaugment=None):
  """The random training transform of a uint8 image: `augmentation`'s parts
  (the table in __init__.py), in order; `randaugment`: its RandAugment's
  settings, where it has one. `crop`: the image is whole (a decoded cache's)
  and the random crop is taken here; otherwise decoding took it."""
  if augmentation.autoaugment:
    policy = autoaugment.policy_v0(size)
  if augmentation.randaugment:
    operations = keras.layers.RandAugment(
        value_range=(0, 255), num_ops=randaugment.layers,
        factor=randaugment.factor)

  def augment(image):
    if augmentation.translates:
      pad = max(size // 8, 1)
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.random_crop(image, (size, size, 3))
    if augmentation.inception_crop and crop:
      image = tf.ensure_shape(decode.crop(image, decode.random_window, size),
                              (size, size, 3))
    if augmentation.flips:
      image = tf.image.random_flip_left_right(image)
    if augmentation.randaugment:
      image = decode.to_uint8(operations(image))
    if augmentation.autoaugment:
      image = policy(image)
    return image

  return augment


def mixer(mixup_alpha, cutmix_alpha, num_classes, size):
  """Batch-level mixup and CutMix, as timm's Mixup in batch mode: each batch
  is blended with itself reversed, with one lambda ~ Beta(alpha, alpha)
  (both on: either, with even odds). Returns mix(batch, seed) ->
  (images, soft labels [batch, classes], skipped); `seed` makes the draw
  stateless, so a seeded run mixes alike however the map is scheduled.

  Images stay uint8 (the blend rounds to the nearest level, at most 1/510
  off). CutMix pastes a box of the partner's pixels and weighs the labels by
  the box's area after clipping to the image.
  """
  rows = tf.range(size)[:, None]
  columns = tf.range(size)[None, :]

  def beta(alpha, seeds):
    a = tf.random.stateless_gamma([], seeds[0], alpha)
    b = tf.random.stateless_gamma([], seeds[1], alpha)
    return a / (a + b)

  def mixup(images, partner, seeds):
    lam = beta(mixup_alpha, seeds)
    blend = (lam * tf.cast(images, tf.float32) +
             (1 - lam) * tf.cast(partner, tf.float32))
    return tf.cast(tf.round(blend), tf.uint8), lam

  def cutmix(images, partner, seeds):
    lam = beta(cutmix_alpha, seeds)
    side = tf.cast(tf.sqrt(1.0 - lam) * size, tf.int32)
    center = tf.random.stateless_uniform([2], seeds[2], 0, size, tf.int32)
    low = tf.clip_by_value(center - side // 2, 0, size)
    high = tf.clip_by_value(center + side // 2, 0, size)
    inside = ((rows >= low[0]) & (rows < high[0]) &
              (columns >= low[1]) & (columns < high[1]))
    area = tf.reduce_sum(tf.cast(inside, tf.float32))
    pasted = tf.where(inside[None, :, :, None], partner, images)
    return pasted, 1.0 - area / (size * size)

  def mix(batch, seed):
    images, labels, skipped = batch
    seeds = tf.random.experimental.stateless_split(seed, 4)
    partner = tf.reverse(images, [0])
    if not (mixup_alpha or cutmix_alpha):  # A stage that does not blend.
      lam = 1.0
    elif mixup_alpha and cutmix_alpha:
      images, lam = tf.cond(
          tf.random.stateless_uniform([], seeds[3]) < 0.5,
          lambda: cutmix(images, partner, seeds),
          lambda: mixup(images, partner, seeds))
    elif cutmix_alpha:
      images, lam = cutmix(images, partner, seeds)
    else:
      images, lam = mixup(images, partner, seeds)
    targets = tf.one_hot(labels, num_classes)
    return images, lam * targets + (1 - lam) * tf.reverse(targets, [0]), skipped

  return mix
