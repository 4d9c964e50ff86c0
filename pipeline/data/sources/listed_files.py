"""Images listed one by one with their labels (a folder of class folders, a
CSV), read as files: each file one record (its bytes, its label, its
path), sharded per pipeline before anything is read, local or gs://; and
the held-out share of a listing, by a hash of each path.
"""

import hashlib
import os

import tensorflow as tf

from pipeline.data.sources.source import check_eval_fraction
from pipeline.errors import UserError
from pipeline.storage import gcs


def held_out(path, root, fraction):
  """Whether `path` is in the held-out eval fraction: a hash of its path
  below `root`, so the same on every host, run and machine."""
  relative = os.path.relpath(path, root).encode()
  bucket = int.from_bytes(hashlib.sha256(relative).digest()[:8], 'big')
  return bucket / 2.0**64 < fraction


def hold_out(files, root, fraction, listed):
  """{'train': files, 'eval': files} of `files` [(path, label)]: a
  `fraction` of them held out by a hash of each path below `root`
  (held_out). A one-line UserError where the fraction is no share or
  leaves a split empty; `listed` says what the files are, for it."""
  check_eval_fraction(fraction)
  parts = {'train': [], 'eval': []}
  for path, label in files:
    parts['eval' if held_out(path, root, fraction) else 'train'].append(
        (path, label))
  for split, part in parts.items():
    if not part:
      raise UserError(f'eval_fraction={fraction} leaves no {split} '
                      f'{listed} among the {len(files)}; change it, or give '
                      'an eval split')
  return parts


def read_files(files, input_context, shuffle, seed):
  """(bytes, label, path) records of this pipeline's share of `files`,
  sharded before anything is read. A file gone since it was listed is
  passed over; one that does not decode is skipped, counted and named later."""
  paths, labels = zip(*files)
  dataset = tf.data.Dataset.from_tensor_slices(
      (list(paths), list(labels))).shard(
          input_context.num_input_pipelines, input_context.input_pipeline_id)
  if shuffle:
    dataset = dataset.shuffle(len(paths), seed=seed,
                              reshuffle_each_iteration=True)
  read = _reader(paths)
  return dataset.map(lambda path, label: (read(path), label, path),
                     num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=not shuffle or seed is not None
                     ).ignore_errors()


def _reader(paths):
  """What reads a file in tf.data: TensorFlow's own reader, local or gs://;
  on gs:// with STORAGE_EMULATOR_HOST set, the google-cloud-storage client,
  as TensorFlow's gs:// cannot reach an emulator."""
  if not (gcs.emulated() and gcs.is_gcs(paths[0])):
    return tf.io.read_file
  return lambda path: tf.ensure_shape(tf.numpy_function(
      lambda name: read_bytes(name.decode()), [path], tf.string,
      stateful=False), [])


def read_bytes(path):
  """A file's bytes, by the same rule as _reader."""
  return read_head(path, None)


def read_head(path, size):
  """A file's first `size` bytes (None: all of them), by the same rule as
  _reader; a gs:// file's first bytes in one ranged read."""
  if gcs.is_gcs(path) and gcs.emulated():
    return gcs.read_object(path)
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read() if size is None else f.read(size)
