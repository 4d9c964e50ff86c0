"""What DALI needs beside the TFRecord files: an index per file, and the
record it could not decode.

DALI's TFRecord reader finds records through an index (a line "offset
length" per record; the format of the tfrecord2idx script its wheel
installs). Each is built once, in one pass that reads only the records'
12-byte headers: beside its file (in a .dali_index folder, which
tfrecords.list_files passes over) where that folder is writable, else in
the staging folder, written whole or not at all (a rename). An index older
than its file, or one reaching past its end, is stale and rebuilt. A file
damaged further in keeps the records before the damage, as tf.data's
reader does.
"""

import hashlib
import os
import struct

from absl import logging

from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.errors import UserError

_HEADER = struct.Struct('<QI')  # Length, then its CRC; the data's CRC after.


def indices(files, staging_dir):
  """The index of each of `files` (local paths), built where missing or
  stale."""
  return [_index(path, staging_dir) for path in files]


def _index(path, staging_dir):
  folder, name = os.path.split(path)
  beside = os.path.join(folder, tfrecords.INDEX_FOLDER, name + '.idx')
  staged = os.path.join(staging_dir, 'dali_index', hashlib.sha256(
      os.path.abspath(path).encode()).hexdigest()[:16] + '.idx')
  for candidate in (beside, staged):
    if _current(candidate, path):
      return candidate
  target = beside if os.access(folder or '.', os.W_OK) else staged
  os.makedirs(os.path.dirname(target), exist_ok=True)
  logging.info('Indexing %s for DALI (%s)', path, target)
  lines = [f'{offset} {length}\n' for offset, length in _records(path)]
  if not lines:
    raise UserError(f'{path} has no readable record: it is not a TFRecord '
                    'file, or is damaged from its start')
  temporary = f'{target}.tmp{os.getpid()}'
  with open(temporary, 'w', encoding='ascii') as f:
    f.writelines(lines)
  os.replace(temporary, target)
  return target


def _current(index, path):
  """True if `index` exists, is newer than `path` and ends within it."""
  try:
    if os.path.getmtime(index) < os.path.getmtime(path):
      return False
    with open(index, encoding='ascii') as f:
      last = f.read().split()[-2:]
    return len(last) == 2 and sum(map(int, last)) <= os.path.getsize(path)
  except (OSError, ValueError):
    return False


def _records(path):
  """(offset, length) of each whole record of a TFRecord file."""
  try:
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
      offset = 0
      while offset + _HEADER.size <= size:
        f.seek(offset)
        length, _ = _HEADER.unpack(f.read(_HEADER.size))
        record = _HEADER.size + length + 4
        if offset + record > size:
          break  # Cut short: the records before it stay readable.
        yield offset, record
        offset += record
  except OSError as e:
    raise UserError(f'cannot read {path}: {e.strerror}') from None


def cpu_threads():
  """DALI's worker threads: the cores this process may use."""
  return max(len(os.sched_getaffinity(0)), 1)


def first_undecodable(files):
  """(file, record number) of the first record tf.data cannot decode
  either, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def decodes(index, record):
    encoded, _ = tfrecords.parse(record)
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return index, tf.shape(image)[0]

  for path in files:
    expected = 0
    dataset = tf.data.TFRecordDataset(path).enumerate().map(
        decodes, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True).ignore_errors()
    for index, _ in dataset.as_numpy_iterator():
      if index != expected:
        return path, expected
      expected += 1
    if expected < sum(1 for _ in _records(path)):
      return path, expected
  return None
