"""Encoded images to the uint8 window the model sees; bad records counted.

Every path decodes with these: a JPEG's crop window alone (decode_window),
evaluation's central square (eval_image, which launch.predict shares), and
records that cannot be decoded skipped and counted in the stream
(decoded_records). A label outside [0, num_classes) stops the run with the
value and the file (label_error).
"""

import re

import tensorflow as tf

from pipeline.data import augmentations

LABEL_ERROR = 'LABEL_OUT_OF_RANGE'
# As tensorflow/tpu's input: AUTOTUNE kept too few decodes in flight for an
# ordered map (1,200 vs 1,320 img/s at 224 px on 2 cores; BUILD_NOTES.md).
DECODES_IN_FLIGHT = 64


def eval_preprocessing(spec):
  """How evaluation turns a file into the model's input (`spec`: the
  run's InputSpec), as the export's metadata records it: see eval_image."""
  return {'image_size': spec.eval_image_size,
          'central_fraction': spec.central_fraction,
          'rule': 'decode (grayscale, RGBA, CMYK -> RGB); take the central '
                  'square of central_fraction of the shorter side; resize it '
                  'to image_size (bilinear; a JPEG at least twice image_size '
                  'decoded at 1/2, 1/4 or 1/8 scale first)'}


def eval_image(encoded, image_size, central_fraction):
  """Encoded JPEG/PNG bytes -> the uint8 [image_size, image_size, 3] input
  evaluation gives the model (the same ops as eval_input_fn)."""
  return decode_window(
      encoded, lambda shape: central_window(shape, central_fraction),
      square(image_size))


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


def central_window(shape, fraction):
  """[top, left, height, width]: the central square of `fraction` of the
  shorter side of an image of `shape` ([height, width, ...])."""
  height, width = shape[0], shape[1]
  side = tf.maximum(tf.cast(
      fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32), 1)
  return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side,
                   side])


def whole_window(shape):
  return tf.stack([0, 0, shape[0], shape[1]])


def square_window(shape):
  return central_window(shape, 1.0)


def random_window(shape):
  """[top, left, height, width] of a random resized crop of an image of
  `shape` ([height, width, channels]): the reference's distribution."""
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
      min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
      area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  whole = tf.reduce_all(tf.equal(size[:2], shape[:2]))  # No box was found.
  return tf.where(whole, central_window(shape,
                                       augmentations.CENTRAL_FRACTION),
                  tf.stack([begin[0], begin[1], size[0], size[1]]))


def square(size):
  return lambda window: tf.constant([size, size])


def shorter_side(size):
  """The window's shape scaled so that its shorter side is `size`."""
  def shape(window):
    hw = tf.cast(window[2:], tf.float32)
    return tf.cast(tf.math.ceil(hw * size / tf.reduce_min(hw)), tf.int32)
  return shape


def decode_window(encoded, window_of, shape_of):
  """uint8 [height, width, 3]: the window `window_of(image shape)` of an
  encoded image, resized to `shape_of(window)`. A JPEG decodes that window
  alone (at 1/2, 1/4 or 1/8 scale where it is at least that many times the
  output), then a bilinear resize; other formats decode whole, then
  resize. channels=3 turns grayscale, RGBA and CMYK into RGB.
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
    return to_uint8(tf.image.resize(image, shape))

  def other():
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    window = window_of(tf.shape(image))
    image = tf.slice(image, [window[0], window[1], 0],
                     [window[2], window[3], 3])
    return resize(image, shape_of(window))

  return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def crop(image, window_of, size):
  """The window `window_of(shape)` of a decoded image, resized to size x size."""
  window = window_of(tf.shape(image))
  image = tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])
  return resize(image, square(size)(window))


def resize(image, shape):
  """uint8 image resized to `shape`: bilinear; antialiased where it shrinks
  by 2x or more."""
  shrink = tf.reduce_min(tf.shape(image)[:2]) >= 2 * tf.reduce_min(shape)
  return to_uint8(tf.cond(
      shrink, lambda: tf.image.resize(image, shape, antialias=True),
      lambda: tf.image.resize(image, shape)))


def to_uint8(image):
  return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


# --- decode, count and name what cannot be decoded ---------------------------
#
# A record that cannot be decoded is skipped, counted and named. The count
# travels with the data: each training example carries the number of records
# skipped just before it in its stream, and the train step sums them. So it
# needs no host variable, and it holds where the pipeline runs on other
# machines (tf.data service workers). Evaluation counts by difference:
# records minus examples evaluated. Each record also carries the origins (its
# file) of the few before it, so the first one decoded after a gap names the
# records in it on stderr.

# Origins kept per record: a gap longer than this names its last ones.
NAMED_PER_GAP = 8
# Records numbered and remembered per scan call.
REMEMBERED_IN_BLOCKS = 64
# Names a stream remembers having printed, so each is printed once.
NAMES_KEPT = 1024


def decoded_records(records, parse, decode, image_shape, num_classes):
  """Parses and decodes records, skipping those that fail: elements
  (image, int32 label, skipped), `skipped` the records dropped just before
  this one (or, for a finite stream's last, also just after it), whose
  origins are printed.

  `decode(encoded)` -> uint8 image of `image_shape`. Records are numbered
  before decoding; after ignore_errors() the gaps in the numbering are the
  skipped records (an ordered map keeps the numbers in order). Every
  source's record ends with its origin. Labels are checked after the
  skipping, so a bad label stops the run rather than pass for a bad record.

  A finite stream (a cache being filled, evaluation) may end in a gap that
  no record follows, where a file's bad last records fall: a marker after
  its last record closes it, and the examples come out one behind, the last
  taking that gap too. An endless one (training uncached) has no last gap,
  and is spared the marker and the holding back, each a cost per record.
  """
  endless = (tf.get_static_value(records.cardinality()) ==
             tf.data.INFINITE_CARDINALITY)

  def decode_record(index, end, record, recent):
    def real():
      encoded, label, origin = parse(*record)
      return (tf.ensure_shape(decode(encoded), image_shape),
              tf.cast(label, tf.int64), origin)
    def marker():
      return (_placeholder(image_shape), tf.constant(0, tf.int64),
              tf.constant(''))
    return (index, end, *(real() if endless else tf.cond(end, marker, real)),
            recent)

  numbered = records.enumerate()
  if not endless:
    numbered = numbered.concatenate(_end_marker(records))
  # In blocks: a scan calls its function per element, about 35 us of CPU
  # each on 2 cores, 5 us a record in blocks of 64 (BUILD_NOTES.md).
  dataset = numbered.batch(REMEMBERED_IN_BLOCKS).scan(
      (tf.constant(-1, tf.int64), tf.fill([NAMED_PER_GAP + 1], '')),
      _remember).unbatch().map(
          decode_record, num_parallel_calls=DECODES_IN_FLIGHT,
          deterministic=True).ignore_errors()
  return _counted(dataset, endless, image_shape, num_classes)


def _remember(state, block):
  """Numbers a block of records and gives each the origins of the
  NAMED_PER_GAP records before it and its own."""
  last, recent = state
  index, record = block
  end = index < 0  # The marker, numbered after the last record.
  index = last + 1 + tf.range(tf.size(index, out_type=tf.int64))
  every = tf.concat([recent, record[-1]], 0)
  windows = (tf.range(tf.size(index))[:, None] +
             tf.range(1, NAMED_PER_GAP + 2)[None, :])
  return ((index[-1], every[-(NAMED_PER_GAP + 1):]),
          (index, end, record, tf.gather(every, windows)))


def _counted(decoded, endless, image_shape, num_classes):
  """(image, int32 label, skipped) of the records that decoded, each with
  the gap before it, named; labels checked. A finite stream's examples
  come out one behind, the last taking the gap its marker closes."""
  def count_gap(last, named, element):
    index, end, _, label, origin, recent = element
    in_range = end | ((label >= 0) & (label < num_classes))
    check = tf.debugging.Assert(in_range, [LABEL_ERROR, label, origin],
                                summarize=1)
    gap = index - last - 1
    named = tf.cond(gap > 0, lambda: _name_skipped(gap, recent, named),
                    lambda: named)
    return gap, named, check

  def each(state, element):
    last, named = state
    index, _, image, label, _, _ = element
    gap, named, check = count_gap(last, named, element)
    with tf.control_dependencies([check]):
      return (index, named), (image, tf.cast(label, tf.int32),
                              tf.cast(gap, tf.int32))

  def one_behind(state, element):
    last, named, held, gap_before = state
    index, end, image, label, _, _ = element
    gap, named, check = count_gap(last, named, element)
    # The example before this one goes out now, with the marker's gap too.
    out = (last >= 0, held[0], tf.cast(held[1], tf.int32), tf.cast(
        gap_before + tf.where(end, gap, tf.zeros_like(gap)), tf.int32))
    with tf.control_dependencies([check]):
      return (index, named, (image, label), gap), out

  start = (tf.constant(-1, tf.int64), tf.zeros([0], tf.string))
  if endless:
    return decoded.scan(start, each)
  empty = (_placeholder(image_shape), tf.constant(0, tf.int64))
  return decoded.scan((*start, empty, tf.constant(0, tf.int64)),
                      one_behind).filter(
                          lambda held, image, label, skipped: held).map(
                              lambda held, image, label, skipped:
                              (image, label, skipped))


def _placeholder(image_shape):
  """A zero image of `image_shape` (1 where a side is unknown), which never
  goes out as an example."""
  return tf.zeros([1 if d is None else d for d in image_shape], tf.uint8)


def _end_marker(records):
  """One element shaped as records.enumerate()'s, numbered -1: zeros, empty
  strings."""
  def zeros(spec):
    return tf.zeros([d or 0 for d in spec.shape], spec.dtype)
  return tf.data.Dataset.from_tensors(
      (tf.constant(-1, tf.int64),
       tf.nest.map_structure(zeros, records.element_spec)))


def _name_skipped(gap, recent, named):
  """Prints the origins of the `gap` records before the last of `recent`
  that this stream has not named yet (a repeated stream meets a bad file
  every pass, and reads passes ahead); returns the names printed so far."""
  shown = tf.minimum(gap, NAMED_PER_GAP)
  names = recent[NAMED_PER_GAP - tf.cast(shown, tf.int32):NAMED_PER_GAP]
  new = tf.boolean_mask(names, tf.logical_not(tf.reduce_any(
      tf.equal(names[:, None], named[None, :]), axis=1)))
  more = tf.cond(gap > shown, lambda: tf.strings.join(
      [' and ', tf.strings.as_string(gap - shown), ' more before them']),
                 lambda: tf.constant(''))

  def say():
    # PrintV2 writes a string as it is; tf.print would quote it.
    printed = tf.raw_ops.PrintV2(input=tf.strings.join(
        [SKIPPED_LINE, tf.strings.reduce_join(new, separator=', '), more]),
                                 output_stream='stderr')
    with tf.control_dependencies([printed]):
      return tf.concat([named, new], 0)[-NAMES_KEPT:]

  return tf.cond(tf.size(new) > 0, say, lambda: named)


SKIPPED_LINE = 'Skipped, cannot be decoded: '


def without_skips(image, label, skipped):
  return image, label, tf.zeros_like(skipped)


# What the input raises where its label check fails (the tf.data iterator
# the step reads, on either backend): label_error words it.
LABEL_CHECK_FAILED = tf.errors.InvalidArgumentError


def label_error(error, num_classes, label_offset):
  """The one-line message for an out-of-range label, or None for others."""
  message = getattr(error, 'message', str(error))
  if LABEL_ERROR not in message:
    return None
  found = re.search(LABEL_ERROR + r'\] \[([^\]]*)\] \[([^\]]*)\]', message)
  label, origin = found.groups() if found else ('?', '?')
  return (f'label {label} (after label_offset={label_offset}) in '
          f'{origin} is outside [0, {num_classes}); check '
          '--config.num_classes and --config.label_offset')
