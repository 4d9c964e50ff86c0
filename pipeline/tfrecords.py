"""TFRecord files in the layout of the Cloud TPU reference models.

Each record is a tf.train.Example with `image/encoded` (JPEG or PNG bytes)
and `image/class/label` (int64; ImageNet's files count from 1, hence the
configurable label offset in data.py).
"""

import tensorflow as tf

from pipeline.errors import UserError

IMAGE_KEY = 'image/encoded'
LABEL_KEY = 'image/class/label'
FEATURES = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
}


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
  if not files:
    raise UserError(f'no file matches {pattern!r}')
  return files


def count_records(files):
  """Records in `files` that the reader can read (one fast pass, no decoding)."""
  dataset = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
  return int(dataset.ignore_errors().reduce(tf.constant(0, tf.int64),
                                            lambda n, _: n + 1))


def parse(record):
  """A serialized Example -> (encoded image bytes, int64 label)."""
  example = tf.io.parse_single_example(record, FEATURES)
  return example[IMAGE_KEY], example[LABEL_KEY]
