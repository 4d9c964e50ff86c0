"""TFRecord files in the layout of the Cloud TPU reference models.

Each record is a tf.train.Example with `image/encoded` (JPEG or PNG bytes)
and `image/class/label` (int64; ImageNet's files count from 1, hence the
configurable label offset in decode.py).
"""

import os

import tensorflow as tf

from pipeline.errors import UserError

IMAGE_KEY = 'image/encoded'
LABEL_KEY = 'image/class/label'
FEATURES = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}


# DALI's indices of the files in a folder (data/dali/index.py), which a glob of
# the folder's files may match.
INDEX_FOLDER = '.dali_index'


def serialize(encoded_image, label):
  """One record: encoded image bytes and an integer label."""
  return tf.train.Example(features=tf.train.Features(feature={
      IMAGE_KEY: tf.train.Feature(
          bytes_list=tf.train.BytesList(value=[encoded_image])),
      LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
  })).SerializeToString()


def write(path, records):
  """Writes serialized records to `path` (local or any tf.io.gfile path)."""
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)


def list_files(pattern):
  """The sorted files matching a glob; a one-line UserError if none do."""
  if not pattern:
    raise UserError('dataset=tfrecord needs --config.train_files=GLOB and '
                    '--config.eval_files=GLOB')
  try:
    files = sorted(tf.io.gfile.glob(pattern))
  except tf.errors.OpError as e:
    raise UserError(f'cannot list files matching {pattern!r}: {e.message}')
  files = [f for f in files if os.path.basename(f) != INDEX_FOLDER]
  if not files:
    raise UserError(f'no file matches {pattern!r}')
  folders = [f for f in files if tf.io.gfile.isdir(f)]
  if folders:
    raise UserError(f'{pattern!r} matches the folder {folders[0]}; give a '
                    f'glob of TFRecord files, e.g. {folders[0]}/train-*')
  return files


def count_records(files):
  """Records in `files` that the reader can read (one fast pass, no decoding).

  A file with no readable record at all is not a TFRecord file (or is
  damaged from its start): a one-line UserError names it. A file damaged
  further in keeps the records before the damage.
  """
  files = list(files)  # A tuple would be a structure to tf.data.
  indices = tf.data.Dataset.from_tensor_slices(
      (files, tf.range(len(files), dtype=tf.int64)))
  per_record = indices.interleave(
      lambda name, index: tf.data.TFRecordDataset(name).ignore_errors().map(
          lambda _: index),
      cycle_length=min(len(files), 16), num_parallel_calls=tf.data.AUTOTUNE)
  counts = per_record.reduce(
      tf.zeros(len(files), tf.int64),
      lambda counts, index: tf.tensor_scatter_nd_add(counts, [[index]], [1]))
  unreadable = [name for name, count in zip(files, counts.numpy()) if not count]
  if unreadable:
    raise UserError(
        f'{unreadable[0]} has no readable record'
        f'{f" (nor {len(unreadable) - 1} other file(s))" if len(unreadable) > 1 else ""}'
        ': it is not a TFRecord file, or is damaged from its start; expected '
        f'TFRecord files of tf.train.Example with {IMAGE_KEY} and {LABEL_KEY}')
  return int(counts.numpy().sum())


def parse(record):
  """A serialized Example -> (encoded image bytes, int64 label)."""
  example = tf.io.parse_single_example(record, FEATURES)
  return example[IMAGE_KEY], example[LABEL_KEY]


def export_tfds(dataset, data_dir, split, output_prefix, num_files,
                image_size=0, image_format='jpeg', label_offset=0,
                transform=lambda examples: examples, quality=90):
  """Writes a tfds split as `num_files` TFRecord files; returns the count.

  Images are re-encoded as JPEG or PNG, optionally resized (to exercise
  decoding at a realistic resolution), and labels shifted by `label_offset`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfds_set import sklearn_digits  # pylint: disable=g-import-not-at-top,unused-import
  builder = tfds.builder(dataset, data_dir=data_dir or None)
  builder.download_and_prepare()
  encode = {'jpeg': lambda x: tf.io.encode_jpeg(x, quality=quality),
            'png': tf.io.encode_png}[image_format]

  def prepare(image, label):
    if image_size:
      image = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(
          image, (image_size, image_size))), 0, 255), tf.uint8)
    return encode(image), label + label_offset

  examples = builder.as_dataset(split=split, as_supervised=True).map(
      prepare, num_parallel_calls=tf.data.AUTOTUNE)
  return write_shards(output_prefix, num_files, transform(
      (encoded, int(label)) for encoded, label in
      examples.as_numpy_iterator()))


def bounded(encoded, max_side, quality):
  """An encoded image as a JPEG of `quality` whose longer side is at most
  `max_side`, its aspect kept (FFCV's stored ImageNet, for random-resized
  crops: they need the aspect, and a smaller JPEG decodes faster); an
  image already within it is only re-encoded where it is no JPEG."""
  image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
  height, width = int(image.shape[0]), int(image.shape[1])
  scale = max_side / max(height, width)
  if scale >= 1:
    if tf.io.is_jpeg(encoded):
      return encoded
    return tf.io.encode_jpeg(image, quality=quality).numpy()
  size = (max(1, round(height * scale)), max(1, round(width * scale)))
  # Antialiased, as PIL's and FFCV's downscaling: a plain bilinear resize
  # of a 4x smaller image aliases.
  resized = tf.image.resize(image, size, antialias=True)
  return tf.io.encode_jpeg(tf.cast(tf.clip_by_value(tf.round(resized), 0,
                                                    255), tf.uint8),
                           quality=quality).numpy()


def write_shards(output_prefix, num_files, examples):
  """Writes (encoded image, label) pairs round-robin into `num_files` files
  `{prefix}-0000i-of-0000n`, the Cloud TPU layout; returns how many."""
  writers = [tf.io.TFRecordWriter(
      f'{output_prefix}-{i:05d}-of-{num_files:05d}') for i in range(num_files)]
  count = 0
  try:
    for count, (encoded, label) in enumerate(examples, 1):
      writers[count % num_files].write(serialize(encoded, label))
  finally:
    for writer in writers:
      writer.close()
  return count


# The class names beside TFRecord files, one per line in index order.
LABELS_FILE = 'labels.txt'


def write_labels(folder, names):
  """The class names beside TFRecord files, one per line in index order."""
  with tf.io.gfile.GFile(os.path.join(folder, LABELS_FILE), 'w') as f:
    f.write(''.join(f'{name}\n' for name in names))


def read_labels(pattern):
  """The class names in the labels file beside files matching `pattern`;
  () where there is none."""
  path = os.path.join(os.path.dirname(pattern), LABELS_FILE)
  if not tf.io.gfile.exists(path):
    return ()
  with tf.io.gfile.GFile(path) as f:
    return tuple(line.rstrip('\n') for line in f if line.strip())
