"""tf.data input built per worker from a source's records (sources.py).

One pipeline serves every source: decode and resize once, cache, then
shuffle, random augmentation, batch and prefetch (augmenting before the
cache would freeze it: every epoch would see the first epoch's crops).
Images stay uint8 until they reach the device, where the model casts them.
Every input function takes a tf.distribute.InputContext, and batches are
per replica.
"""

import os
import re

from absl import logging
import keras
import tensorflow as tf

from pipeline import gcs
from pipeline import storage
from pipeline.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
AUGMENTATIONS = ('none', 'translate', 'translate_flip', 'inception',
                 'inception_randaugment')
# Inception-style runs cache a larger image; eval takes the central 87.5%.
_CENTRAL_FRACTION = 0.875
_LABEL_ERROR = 'LABEL_OUT_OF_RANGE'


# --- decode, count what cannot be decoded -------------------------------------


class SkipCounter:
  """Counts records dropped because they could not be decoded.

  The count lives in a host variable that the input pipeline updates, read by
  the training loop for logs and metrics.json. Counted once per pass over the
  data before the cache, so a cached set is counted once.
  """

  def __init__(self):
    with tf.device('/cpu:0'):
      self.variable = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name='skipped_records')

  @property
  def count(self):
    return int(self.variable.numpy())


def eval_preprocessing(config):
  """How evaluation turns a file into the model's input, as the export's
  metadata records it: see eval_image."""
  return {'image_size': config.image_size, 'decode_size': _cache_size(config),
          'rule': 'decode (grayscale, RGBA, CMYK -> RGB); resize the shorter '
                  'side to decode_size (antialiased); centre crop '
                  'decode_size; centre crop image_size'}


def eval_image(encoded, image_size, decode_size):
  """Encoded JPEG/PNG bytes -> the uint8 [image_size, image_size, 3] input
  evaluation gives the model (the same ops as eval_input_fn)."""
  image = _decode_image(encoded, decode_size)
  return _central_crop(image, None, image_size)[0]


def _cache_size(config):
  if config.augment.startswith('inception'):
    return int(round(config.image_size / _CENTRAL_FRACTION))
  return config.image_size


def _decode_image(encoded, size):
  """Encoded bytes -> uint8 [size, size, 3]: shorter side resized, centre crop.

  decode_image with channels=3 turns grayscale, RGBA and CMYK into RGB.
  """
  image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = size / tf.reduce_min(shape)
  new_shape = tf.cast(tf.math.ceil(shape * scale), tf.int32)
  image = tf.image.resize(image, new_shape, antialias=True)
  top = (new_shape[0] - size) // 2
  left = (new_shape[1] - size) // 2
  image = image[top:top + size, left:left + size]
  image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
  return tf.ensure_shape(image, (size, size, 3))


def _decoded(records, parse, size, counter):
  """Parses and decodes records, skipping (and counting) those that fail.

  Records are numbered before decoding and a sentinel closes the stream;
  after ignore_errors() the gaps in the numbering are the skipped records.
  """
  sentinel = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                   records.element_spec)
  flagged = records.map(lambda *record: (record, True)).concatenate(
      tf.data.Dataset.from_tensors((sentinel, False))).enumerate()

  def decode(index, flagged_record):
    record, is_record = flagged_record

    def real():
      encoded, label, origin = parse(*record)
      return _decode_image(encoded, size), tf.cast(label, tf.int64), origin

    def end():
      return tf.zeros((size, size, 3), tf.uint8), tf.constant(-1, tf.int64), ''

    return (index, is_record) + tuple(tf.cond(is_record, real, end))

  dataset = flagged.map(decode, num_parallel_calls=AUTOTUNE,
                        deterministic=True).ignore_errors()

  def count_gap(last, element):
    index, is_record, image, label, origin = element
    counter.variable.assign_add(index - last - 1)
    return index, (is_record, image, label, origin)

  dataset = dataset.scan(tf.constant(-1, tf.int64), count_gap)
  return dataset.filter(lambda is_record, *_: is_record).map(
      lambda is_record, image, label, origin: (image, label, origin))


def _checked_label(image, label, origin, num_classes):
  in_range = (label >= 0) & (label < num_classes)
  check = tf.debugging.Assert(in_range, [_LABEL_ERROR, label, origin],
                              summarize=1)
  with tf.control_dependencies([check]):
    return image, tf.cast(label, tf.int32)


def label_error(error, num_classes, label_offset):
  """The one-line message for an out-of-range label, or None for others."""
  message = getattr(error, 'message', str(error))
  if _LABEL_ERROR not in message:
    return None
  found = re.search(_LABEL_ERROR + r'\] \[([^\]]*)\] \[([^\]]*)\]', message)
  label, origin = found.groups() if found else ('?', '?')
  return (f'label {label} (after label_offset={label_offset}) in '
          f'{origin} is outside [0, {num_classes}); check '
          '--config.num_classes and --config.label_offset')


# --- augmentation -------------------------------------------------------------


def _random_resized_crop(image, size):
  """ImageNet-style crop: 8%-100% of the area, aspect 3/4-4/3, then resize."""
  begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.zeros((1, 0, 4)),
      min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
      area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  image = tf.slice(image, begin, crop_size)
  image = tf.image.resize(image, (size, size), antialias=True)
  image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
  return tf.ensure_shape(image, (size, size, 3))


def _augmenter(kind, size):
  """The random training transform for `kind`, uint8 in and out."""
  randaugment = keras.layers.RandAugment(value_range=(0, 255), num_ops=2,
                                         factor=0.5)

  def augment(image, label):
    if kind.startswith('translate'):
      pad = max(size // 8, 1)
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.random_crop(image, (size, size, 3))
    if kind.startswith('inception'):
      image = _random_resized_crop(image, size)
    if kind in ('translate_flip', 'inception', 'inception_randaugment'):
      image = tf.image.random_flip_left_right(image)
    if kind == 'inception_randaugment':
      image = tf.cast(tf.clip_by_value(tf.round(randaugment(image)), 0, 255),
                      tf.uint8)
    return image, label

  return augment


def _central_crop(image, label, size):
  offset = (image.shape[0] - size) // 2
  return image[offset:offset + size, offset:offset + size], label


# --- caching -------------------------------------------------------------------


def _available_memory_bytes():
  """MemAvailable (free plus reclaimable page cache), else free pages."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def check_cache(config, source, available_bytes=None):
  """Refuses a memory cache that would not fit in the free RAM (half of it),
  or a file cache whose folder cannot be written."""
  if not config.cache or gcs.is_gcs(config.cache):
    return  # No cache, or a TPU Node's, which its workers write.
  if config.cache != 'memory':
    try:
      storage.check_writable(os.path.dirname(os.path.abspath(config.cache)),
                             what=f'cache={config.cache!r}: folder')
    except UserError as e:
      raise UserError(f"{e}; use a writable path prefix, 'memory' or '' "
                      '(no cache)') from None
    return
  size = _cache_size(config)
  needed = (source.num_train_examples + source.num_eval_examples) * size**2 * 3
  available = available_bytes or _available_memory_bytes()
  if needed > available // 2:
    raise UserError(
        f'cache=memory needs about {needed / 2**30:.1f} GiB for '
        f'{source.num_train_examples + source.num_eval_examples} images at '
        f'{size} px, more than half the {available / 2**30:.1f} GiB free; use '
        "--config.cache=/local/path/prefix (a file cache) or --config.cache=''")


def _cache(dataset, config, split, input_context):
  if config.cache == 'memory':
    return dataset.cache()
  if config.cache:
    # One file cache per split and input pipeline; each holds its own shard.
    prefix = f'{config.cache}-{split}-{input_context.input_pipeline_id}'
    _remove_stale_cache_lock(prefix)
    return dataset.cache(prefix)
  return dataset


def _remove_stale_cache_lock(prefix):
  """Removes what a run stopped mid-way through writing a file cache left.

  tf.data writes the cache in the first pass under a lock file and renames
  it into place at the end; a run killed before that leaves the lock, and
  the next run would fail in its first step ("concurrent caching iterator
  running"). Only this run reads and writes its pipeline's prefix.
  """
  leftovers = (tf.io.gfile.glob(f'{prefix}*.lockfile') +
               tf.io.gfile.glob(f'{prefix}*.tempstate*'))
  for path in leftovers:
    logging.warning('Removing %s, left by a run that stopped while writing '
                    'its cache; the cache is written anew', path)
    tf.io.gfile.remove(path)


# --- input functions ------------------------------------------------------------


def train_input_fn(config, source, global_batch_size, counter):
  """An input function for strategy.distribute_datasets_from_function."""
  validate(config)
  seed = config.seed if config.deterministic_input else None
  size = _cache_size(config)

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = source.read('train', input_context, True, seed)
    dataset = _decoded(dataset, source.parse, size, counter).map(
        lambda x, y, o: _checked_label(x, y, o, source.num_classes))
    dataset = _cache(dataset, config, 'train', input_context)
    buffer = min(config.shuffle_buffer, source.num_train_examples)
    dataset = dataset.shuffle(buffer, seed=seed).repeat()
    dataset = dataset.map(_augmenter(config.augment, config.image_size),
                          num_parallel_calls=AUTOTUNE)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.deterministic = config.deterministic_input
    return dataset.with_options(options).prefetch(AUTOTUNE)

  return input_fn


def eval_steps(source, global_batch_size):
  """Steps that cover every held-out example once (the last batch padded)."""
  return -(-source.num_eval_examples // global_batch_size)


def eval_input_fn(config, source, global_batch_size, counter):
  """Held-out examples as (image, label, weight), padded to full batches.

  Each pipeline pads its shard with weight-0 examples to the same number of
  full batches, so every example counts exactly once while every batch keeps
  the static shape TPUs need.
  """
  validate(config)
  size = config.image_size
  steps = eval_steps(source, global_batch_size)

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    per_pipeline = steps * global_batch_size // input_context.num_input_pipelines
    dataset = source.read('eval', input_context, False, None)
    dataset = _decoded(dataset, source.parse, _cache_size(config),
                       counter).map(
        lambda x, y, o: _checked_label(x, y, o, source.num_classes))
    dataset = dataset.map(lambda x, y: _central_crop(x, y, size) + (1.0,))
    padding = tf.data.Dataset.from_tensors(
        (tf.zeros((size, size, 3), tf.uint8), 0, 0.0)).repeat()
    dataset = dataset.concatenate(padding).take(per_pipeline)
    dataset = _cache(dataset, config, 'eval', input_context)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)

  return input_fn


def validate(config):
  """A one-line UserError for an augmentation this module does not know."""
  if config.augment not in AUGMENTATIONS:
    raise UserError(f'unknown augment {config.augment!r}; accepted: '
                    f'{", ".join(AUGMENTATIONS)}')
