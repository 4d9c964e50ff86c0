"""tf.data input built per worker from a source's records (sources.py).

One pipeline serves every source. Each record is decoded to just the window
the model sees (a JPEG's crop window alone), skipped and counted if it
cannot be. What is cached (choose_cache): decoded images, augmented after
the cache every epoch (augmenting before it would freeze the first epoch's
crops); or the encoded records, decoded and cropped every epoch; or nothing.
Then batch and prefetch. Images stay uint8 until they reach the device,
where the model casts them. Every input function takes a
tf.distribute.InputContext, and batches are per replica.
"""

import os
import re

from absl import logging
import keras
import tensorflow as tf

from pipeline import data_service
from pipeline import gcs
from pipeline import storage
from pipeline.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
AUGMENTATIONS = ('none', 'translate', 'translate_flip', 'inception',
                 'inception_randaugment')
# Inception-style runs cache a larger image; eval takes the central 87.5%.
_CENTRAL_FRACTION = 0.875
_LABEL_ERROR = 'LABEL_OUT_OF_RANGE'
# As tensorflow/tpu's input: AUTOTUNE kept too few decodes in flight for an
# ordered map (1,200 vs 1,320 img/s at 224 px on 2 cores; BUILD_NOTES.md).
_DECODES_IN_FLIGHT = 64


def eval_preprocessing(config):
  """How evaluation turns a file into the model's input, as the export's
  metadata records it: see eval_image."""
  fraction = _central_fraction(config)
  return {'image_size': config.image_size, 'central_fraction': fraction,
          'rule': 'decode (grayscale, RGBA, CMYK -> RGB); take the central '
                  'square of central_fraction of the shorter side; resize it '
                  'to image_size (bilinear; a JPEG at least twice image_size '
                  'decoded at 1/2, 1/4 or 1/8 scale first)'}


def eval_image(encoded, image_size, central_fraction):
  """Encoded JPEG/PNG bytes -> the uint8 [image_size, image_size, 3] input
  evaluation gives the model (the same ops as eval_input_fn)."""
  return _decode_window(
      encoded, lambda shape: _central_window(shape, central_fraction),
      _square(image_size))


def _central_fraction(config):
  # Inception-style runs evaluate the central 87.5%, as ImageNet recipes do.
  return _CENTRAL_FRACTION if config.augment.startswith('inception') else 1.0


def _cache_size(config):
  """The shorter side of what a decoded cache holds for training."""
  return int(round(config.image_size / _central_fraction(config)))


# --- decode: only the window the model will see -------------------------------
#
# One crop distribution for every path: tensorflow/tpu's ImageNet training
# crop (models/official/efficientnet/preprocessing.py): a box of 8%-100% of
# the whole image's area, aspect 3/4-4/3, 10 attempts, else the central 87.5%
# square. Uncached, only that window of a JPEG is decoded
# (decode_and_crop_jpeg); a decoded cache holds the whole image (aspect kept)
# and the same box is sampled on it each epoch, so both see the same crops.
#
# Resizing is bilinear: a quarter of the cost of an antialiased resize (0.45
# vs 1.96 ms for a 300x250 crop to 224, measured; BUILD_NOTES.md). Bilinear
# aliases when it shrinks by 2x or more, so a JPEG window at least twice the
# output is decoded at 1/2, 1/4 or 1/8 scale by libjpeg's scaled IDCT (an area
# average, and cheaper); only what still shrinks by 2x or more (other
# formats) takes the antialiased resize.


def _central_window(shape, fraction):
  """[top, left, height, width]: the central square of `fraction` of the
  shorter side of an image of `shape` ([height, width, ...])."""
  height, width = shape[0], shape[1]
  side = tf.maximum(tf.cast(
      fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32), 1)
  return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side,
                   side])


def _whole_window(shape):
  return tf.stack([0, 0, shape[0], shape[1]])


def _square_window(shape):
  return _central_window(shape, 1.0)


def _random_window(shape):
  """[top, left, height, width] of a random resized crop of an image of
  `shape` ([height, width, channels]): the reference's distribution."""
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
      min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
      area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  whole = tf.reduce_all(tf.equal(size[:2], shape[:2]))  # No box was found.
  return tf.where(whole, _central_window(shape, _CENTRAL_FRACTION),
                  tf.stack([begin[0], begin[1], size[0], size[1]]))


def _square(size):
  return lambda window: tf.constant([size, size])


def _shorter_side(size):
  """The window's shape scaled so that its shorter side is `size`."""
  def shape(window):
    hw = tf.cast(window[2:], tf.float32)
    return tf.cast(tf.math.ceil(hw * size / tf.reduce_min(hw)), tf.int32)
  return shape


def _decode_window(encoded, window_of, shape_of):
  """uint8 [height, width, 3]: the window `window_of(image shape)` of an
  encoded image, resized to `shape_of(window)`. A JPEG decodes that window
  alone (at 1/2, 1/4 or 1/8 scale where it is at least that many times the
  output), then a bilinear resize; other formats decode whole, then
  _resize. channels=3 turns grayscale, RGBA and CMYK into RGB.
  """
  def jpeg():
    window = window_of(tf.image.extract_jpeg_shape(encoded))
    shape = shape_of(window)
    shrink = tf.reduce_min(window[2:]) // tf.reduce_min(shape)
    scale = tf.reduce_sum(tf.cast(shrink >= [2, 4, 8], tf.int32))

    def at(ratio):
      return lambda: tf.image.decode_and_crop_jpeg(
          encoded, window // ratio, channels=3, ratio=ratio)

    image = tf.switch_case(scale, [at(1), at(2), at(4), at(8)])
    return _to_uint8(tf.image.resize(image, shape))

  def other():
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    window = window_of(tf.shape(image))
    image = tf.slice(image, [window[0], window[1], 0],
                     [window[2], window[3], 3])
    return _resize(image, shape_of(window))

  return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _crop(image, window_of, size):
  """The window `window_of(shape)` of a decoded image, resized to size x size."""
  window = window_of(tf.shape(image))
  image = tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])
  return _resize(image, _square(size)(window))


def _resize(image, shape):
  """uint8 image resized to `shape`: bilinear; antialiased where it shrinks
  by 2x or more."""
  shrink = tf.reduce_min(tf.shape(image)[:2]) >= 2 * tf.reduce_min(shape)
  return _to_uint8(tf.cond(
      shrink, lambda: tf.image.resize(image, shape, antialias=True),
      lambda: tf.image.resize(image, shape)))


def _to_uint8(image):
  return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


# --- decode, count what cannot be decoded -------------------------------------
#
# A record that cannot be decoded is skipped and counted. The count travels
# with the data: each training example carries the number of records skipped
# just before it in its stream, and the train step sums them. So it needs no
# host variable, and it holds where the pipeline runs on other machines
# (tf.data service workers). Evaluation counts by difference: records minus
# examples evaluated.


def _decoded(records, parse, decode, image_shape, num_classes):
  """Parses and decodes records, skipping those that fail: elements
  (image, int32 label, skipped), `skipped` the records dropped just before
  this one.

  `decode(encoded)` -> uint8 image of `image_shape`. Records are numbered
  before decoding; after ignore_errors() the gaps in the numbering are the
  skipped records (an ordered map keeps the numbers in order: no measurable
  cost, BUILD_NOTES.md). Labels are checked after the skipping, so a bad
  label stops the run rather than pass for a bad record.
  """
  def decode_record(index, record):
    encoded, label, origin = parse(*record)
    return (index, tf.ensure_shape(decode(encoded), image_shape),
            tf.cast(label, tf.int64), origin)

  dataset = records.enumerate().map(
      decode_record, num_parallel_calls=_DECODES_IN_FLIGHT,
      deterministic=True).ignore_errors()

  def count_gap(last, element):
    index, image, label, origin = element
    in_range = (label >= 0) & (label < num_classes)
    check = tf.debugging.Assert(in_range, [_LABEL_ERROR, label, origin],
                                summarize=1)
    with tf.control_dependencies([check]):
      return index, (image, tf.cast(label, tf.int32),
                     tf.cast(index - last - 1, tf.int32))

  return dataset.scan(tf.constant(-1, tf.int64), count_gap)


def _without_skips(image, label, skipped):
  return image, label, tf.zeros_like(skipped)


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


def _augmenter(kind, size, crop):
  """The random training transform of a uint8 image for `kind`. `crop`: the
  image is whole (a decoded cache's) and the random crop is taken here;
  otherwise decoding took it."""
  randaugment = keras.layers.RandAugment(value_range=(0, 255), num_ops=2,
                                         factor=0.5)

  def augment(image):
    if kind.startswith('translate'):
      pad = max(size // 8, 1)
      image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
      image = tf.image.random_crop(image, (size, size, 3))
    if kind.startswith('inception') and crop:
      image = tf.ensure_shape(_crop(image, _random_window, size),
                              (size, size, 3))
    if kind in ('translate_flip', 'inception', 'inception_randaugment'):
      image = tf.image.random_flip_left_right(image)
    if kind == 'inception_randaugment':
      image = _to_uint8(randaugment(image))
    return image

  return augment


def _mixer(mixup_alpha, cutmix_alpha, num_classes, size):
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
    if mixup_alpha and cutmix_alpha:
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


def choose_cache(config, source, available_bytes=None):
  """What `config.cache` caches: (kind, why), kind one of CACHE_KINDS.

  'memory' holds the decoded images where they fit in half the free RAM,
  else the encoded records (decoded and cropped again each epoch: about the
  cost of no cache, without the reads), else refuses in one line. A file
  prefix holds decoded images on disk; its folder must be writable.
  """
  if not config.cache:
    return 'none', "cache=''"
  if gcs.is_gcs(config.cache):  # A TPU Node's, which its workers write.
    return 'decoded', f'cache={config.cache!r}, on the TPU workers'
  if config.cache != 'memory':
    try:
      storage.check_writable(os.path.dirname(os.path.abspath(config.cache)),
                             what=f'cache={config.cache!r}: folder')
    except UserError as e:
      raise UserError(f"{e}; use a writable path prefix, 'memory' or '' "
                      '(no cache)') from None
    return 'decoded', f'file cache {config.cache}-*'
  size, examples = _cache_size(config), (source.num_train_examples +
                                         source.num_eval_examples)
  # A decoded cache keeps each training image's aspect (about 4:3) for
  # random crops; evaluation's images are final.
  aspect = 4 / 3 if config.augment.startswith('inception') else 1
  decoded = 3 * (source.num_train_examples * size**2 * aspect +
                 source.num_eval_examples * config.image_size**2)
  available = available_bytes or _available_memory_bytes()
  gib = lambda n: f'{n / 2**30:.1f} GiB'
  if decoded <= available // 2:
    return 'decoded', (f'decoded images, {gib(decoded)}, fit in half the '
                       f'{gib(available)} free')
  if source.encoded_bytes and source.encoded_bytes <= available // 2:
    return 'encoded', (
        f'decoded images would take {gib(decoded)}, more than half the '
        f'{gib(available)} free; the encoded records, '
        f'{gib(source.encoded_bytes)}, fit: decoded and cropped each epoch')
  raise UserError(
      f'cache=memory needs about {gib(decoded)} for {examples} decoded '
      f'images at {size} px'
      + (f' ({gib(source.encoded_bytes)} encoded)'
         if source.encoded_bytes else '') +
      f', more than half the {gib(available)} free; use '
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


def _default_cache(config):
  return 'decoded' if config.cache else 'none'


def train_input_fn(config, source, global_batch_size, cache=None,
                   service_job='train'):
  """An input function for strategy.distribute_datasets_from_function:
  batches of (uint8 images, int32 labels, int32 records skipped before each);
  with mixup or CutMix, float32 soft labels [batch, classes] instead.

  `cache`: choose_cache's kind (default: 'decoded' if config.cache). A
  decoded cache holds whole images and augments after it; otherwise the
  shuffled records are decoded with their random crop each epoch. With
  config.data_service, the service's workers run it all as `service_job`.
  """
  validate(config)
  cache = cache or _default_cache(config)
  seed = config.seed if config.deterministic_input else None
  size = config.image_size
  inception = config.augment.startswith('inception')
  mixup_alpha = config.get('mixup_alpha', 0.0)
  cutmix_alpha = config.get('cutmix_alpha', 0.0)

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    buffer = min(config.shuffle_buffer, source.num_train_examples)
    records = source.read('train', input_context, True, seed)
    if cache == 'decoded':
      # Inception crops need the whole image (aspect kept); others are
      # final once decoded.
      window, shape_of, image_shape = (
          (_whole_window, _shorter_side(_cache_size(config)), (None, None, 3))
          if inception else (_square_window, _square(size), (size, size, 3)))
      dataset = _cache(_decoded(
          records, source.parse,
          lambda encoded: _decode_window(encoded, window, shape_of),
          image_shape, source.num_classes), config, 'train', input_context)
      # Both read the one cache; the records were skipped once.
      rest = dataset.map(_without_skips).shuffle(
          buffer, seed=None if seed is None else seed + 1).repeat()
      augment = _augmenter(config.augment, size, crop=True)
      dataset = dataset.shuffle(buffer, seed=seed).concatenate(rest).map(
          lambda image, label, skipped: (augment(image), label, skipped),
          num_parallel_calls=AUTOTUNE)
    else:
      if cache == 'encoded':
        records = _cache(records, config, 'train', input_context)
      records = records.shuffle(buffer, seed=seed).repeat()
      window = _random_window if inception else _square_window
      augment = _augmenter(config.augment, size, crop=False)
      # Augmented as decoded: one parallel stage.
      dataset = _decoded(
          records, source.parse,
          lambda encoded: augment(
              _decode_window(encoded, window, _square(size))),
          (size, size, 3), source.num_classes)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if mixup_alpha or cutmix_alpha:
      mix = _mixer(mixup_alpha, cutmix_alpha, source.num_classes, size)
      # Seeded by the config's seed, the pipeline and the batch's index.
      stream = config.seed * 1024 + input_context.input_pipeline_id
      dataset = dataset.enumerate().map(
          lambda index, batch: mix(batch, tf.stack(
              [tf.constant(stream, tf.int64), index])),
          num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = config.deterministic_input
    dataset = dataset.with_options(options)
    if config.get('data_service', ''):
      dataset = data_service.distribute(dataset, config.data_service,
                                        service_job)
    return dataset.prefetch(AUTOTUNE)

  return input_fn


def eval_steps(source, global_batch_size):
  """Steps that cover every held-out example once (the last batch padded)."""
  return -(-source.num_eval_examples // global_batch_size)


def eval_input_fn(config, source, global_batch_size, cache=None):
  """Held-out examples as (image, label, weight), padded to full batches.

  Each pipeline pads its shard with weight-0 examples to the same number of
  full batches, so every example counts exactly once while every batch keeps
  the static shape TPUs need. A decoded cache holds the final images.
  """
  validate(config)
  cache = cache or _default_cache(config)
  size = config.image_size
  steps = eval_steps(source, global_batch_size)
  fraction = _central_fraction(config)

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    per_pipeline = steps * global_batch_size // input_context.num_input_pipelines
    records = source.read('eval', input_context, False, None)
    if cache == 'encoded':
      records = _cache(records, config, 'eval', input_context)
    dataset = _decoded(
        records, source.parse,
        lambda encoded: eval_image(encoded, size, fraction),
        (size, size, 3), source.num_classes)
    dataset = dataset.map(lambda image, label, skipped: (image, label, 1.0))
    padding = tf.data.Dataset.from_tensors(
        (tf.zeros((size, size, 3), tf.uint8), 0, 0.0)).repeat()
    dataset = dataset.concatenate(padding).take(per_pipeline)
    if cache == 'decoded':
      dataset = _cache(dataset, config, 'eval', input_context)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)

  return input_fn


def validate(config):
  """A one-line UserError for an input setting that cannot work."""
  if config.augment not in AUGMENTATIONS:
    raise UserError(f'unknown augment {config.augment!r}; accepted: '
                    f'{", ".join(AUGMENTATIONS)}')
  data_service.validate(config)
