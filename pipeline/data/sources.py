"""Where examples come from: a tensorflow-datasets set, TFRecord files, a
folder of class folders (image_folder.py) or a CSV of image paths and
labels (csv_files.py); data/kinds.py says what a run asks of each.

Every source becomes a stream of (encoded image, label, origin) records, read
per worker: each worker reads its own files (or, with fewer files than
workers, its own examples). Decoding is decode.py's, after sharding, so a
worker never pays to decode another's examples.
"""

import contextlib
import dataclasses
import io
from typing import Callable

from absl import logging
import tensorflow as tf
import tensorflow_datasets as tfds

from pipeline.data import csv_files
from pipeline.data import image_folder
from pipeline.data import sklearn_digits  # pylint: disable=unused-import  (registers the builder)
from pipeline.data import tfrecords
from pipeline.errors import UserError
from pipeline.errors import first_line

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Source:
  """Where the examples come from, and how many there are."""
  name: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  # read(split, input_context, shuffle, seed) -> records of this pipeline.
  read: Callable[..., tf.data.Dataset]
  # parse(*record) -> (encoded image, label, origin); may fail for bad data.
  parse: Callable[..., tuple]
  class_names: tuple = ()  # Index -> name; () where the source has none.
  encoded_bytes: int = 0  # Both splits' records as stored; 0: unknown.

  def class_name(self, index):
    return self.class_names[index] if self.class_names else str(index)


def load_source(config):
  """The Source `config.dataset` names (a tfds name, or a key of
  data/kinds.py's KINDS); a one-line UserError if it cannot be read."""
  return _LOADERS.get(config.dataset, _tfds_source)(config)


# --- tensorflow-datasets ---------------------------------------------------


def _prepare(builder):
  """download_and_prepare; for the bundled set, quietly: tfds would print
  "Downloading and preparing dataset Unknown size" and progress bars for
  data that ship with scikit-learn. A real download keeps its display."""
  if builder.name != 'sklearn_digits':
    builder.download_and_prepare()
    return
  chatter = io.StringIO()
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(chatter):
      builder.download_and_prepare()
  finally:
    tfds.enable_progress_bar()
  if 'Dataset sklearn_digits downloaded and prepared' in chatter.getvalue():
    logging.info('Prepared sklearn_digits (bundled with scikit-learn) in %s',
                 builder.data_dir)


def _tfds_source(config):
  try:
    builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(f'unknown dataset {config.dataset!r}; accepted: '
                    "'tfrecord' or a tensorflow-datasets image classification "
                    'name, e.g. sklearn_digits (offline), cifar10, imagenet2012')
  try:
    _prepare(builder)
  except Exception as e:  # Network, disk and manual-download errors alike.
    raise UserError(f'dataset {config.dataset!r} could not be prepared in '
                    f'{builder.data_dir}: {first_line(e)}')
  features = builder.info.features
  if not ('label' in features and 'image' in features and
          isinstance(features['label'], tfds.features.ClassLabel) and
          isinstance(features['image'], tfds.features.Image)):
    raise UserError(f'dataset {config.dataset!r} has no image and class label; '
                    'it is not an image classification data set')
  splits = {'train': config.train_split,
            'eval': config.eval_split or _held_out_split(builder)}
  sizes = {k: _num_examples(builder, v) for k, v in splits.items()}

  def read(split, input_context, shuffle, seed):
    name = splits[split]
    pipelines = input_context.num_input_pipelines
    by_file = _num_files(builder, name) >= pipelines
    dataset = builder.as_dataset(
        split=name, shuffle_files=shuffle and by_file,
        read_config=tfds.ReadConfig(
            input_context=input_context if pipelines > 1 and by_file else None,
            shuffle_seed=seed, try_autocache=False),
        # Shard and count before decoding: decode in our pipeline.
        decoders={'image': tfds.decode.SkipDecoding()})
    dataset = dataset.map(lambda x: (x['image'], x['label'], name))
    if pipelines > 1 and not by_file:
      dataset = dataset.shard(pipelines, input_context.input_pipeline_id)
    return dataset

  return Source(config.dataset, features['label'].num_classes,
                sizes['train'], sizes['eval'], read,
                parse=lambda image, label, split: (image, label, split),
                class_names=tuple(features['label'].names),
                encoded_bytes=sum(_num_bytes(builder, v)
                                  for v in splits.values()))


def _held_out_split(builder):
  for name in ('validation', 'test'):
    if name in builder.info.splits:
      return name
  raise UserError(f'dataset {builder.name!r} has no validation or test split; '
                  'set --config.eval_split (e.g. "train[90%:]") and '
                  '--config.train_split (e.g. "train[:90%]")')


def _num_files(builder, split):
  try:
    return builder.info.splits[split].num_shards
  except (KeyError, ValueError):  # No split metadata (e.g. tfds mock data).
    return 1


def _num_bytes(builder, split):
  try:
    return int(builder.info.splits[split].num_bytes)
  except (KeyError, ValueError, AttributeError, TypeError):
    return 0  # A sub-split or mock data: unknown.


def _num_examples(builder, split):
  if not builder.info.splits:
    # No split metadata (tfds mock data, some community sets): count once.
    return int(builder.as_dataset(split=split).reduce(0, lambda n, _: n + 1))
  try:
    return builder.info.splits[split].num_examples
  except (KeyError, ValueError) as e:
    raise UserError(f'split {split!r} does not exist in {builder.name!r} '
                    f'(splits: {", ".join(builder.info.splits)}): '
                    f'{first_line(e)}')


# --- TFRecord files ---------------------------------------------------------


def _tfrecord_source(config):
  if config.num_classes < 1:
    raise UserError('dataset=tfrecord needs --config.num_classes=N (N >= 1)')
  files = {'train': tfrecords.list_files(config.train_files),
           'eval': tfrecords.list_files(config.eval_files)}
  sizes = {'train': config.num_train_examples or
                    tfrecords.count_records(files['train']),
           'eval': config.num_eval_examples or
                   tfrecords.count_records(files['eval'])}
  offset = config.label_offset

  def read(split, input_context, shuffle, seed):
    names = files[split]
    pipelines, index = (input_context.num_input_pipelines,
                        input_context.input_pipeline_id)
    by_file = len(names) >= pipelines
    if by_file:
      names = names[index::pipelines]
    dataset = tf.data.Dataset.from_tensor_slices(names)
    if shuffle:
      dataset = dataset.shuffle(len(names), seed=seed)

    def records_of(filename):
      # A record with corrupt framing ends its file: TF's reader cannot
      # resynchronise after it. Skip the rest rather than crash the run.
      # 8 MiB read buffers, as tensorflow/tpu reads ImageNet from GCS.
      return tf.data.Dataset.zip(
          tf.data.TFRecordDataset(filename, buffer_size=8 * 2**20)
          .ignore_errors(), tf.data.Dataset.from_tensors(filename).repeat())

    dataset = dataset.interleave(records_of, cycle_length=min(len(names), 16),
                                 num_parallel_calls=AUTOTUNE,
                                 deterministic=not shuffle or seed is not None)
    if not by_file:
      dataset = dataset.shard(pipelines, index)
    return dataset

  def parse(record, filename):
    encoded, label = tfrecords.parse(record)
    return encoded, label - offset, filename

  names = image_folder.read_labels(config.train_files)
  if names and len(names) != config.num_classes:
    raise UserError(f'{image_folder.LABELS_FILE} beside {config.train_files!r}'
                    f' names {len(names)} classes, not num_classes='
                    f'{config.num_classes}')
  return Source('tfrecord', config.num_classes, sizes['train'], sizes['eval'],
                read, parse, class_names=names, encoded_bytes=sum(
                    tf.io.gfile.stat(name).length
                    for names in files.values() for name in names))


# --- A folder of class folders -----------------------------------------------


def _image_folder_source(config):
  if not config.train_dir:
    raise UserError('dataset=image_folder needs --config.train_dir=PATH, a '
                    'folder of class folders (local or gs://)')
  names, files = image_folder.splits(config)
  if config.num_classes and config.num_classes != len(names):
    raise UserError(f'num_classes={config.num_classes}, but '
                    f'{config.train_dir!r} holds {len(names)} class folders; '
                    'leave num_classes at 0 for image_folder')

  def read(split, input_context, shuffle, seed):
    return image_folder.read_files(files[split], input_context, shuffle, seed)

  return Source('image_folder', len(names), len(files['train']),
                len(files['eval']), read,
                parse=lambda encoded, label, path: (encoded, label, path),
                class_names=names)


# --- A CSV of image paths and labels -------------------------------------------


def _csv_source(config):
  if not config.train_csv:
    raise UserError('dataset=csv needs --config.train_csv=PATH, a CSV of '
                    'image paths and labels (local or gs://)')
  names, files, num_classes = csv_files.splits(config)
  if names and config.num_classes not in (0, len(names)):
    raise UserError(f'num_classes={config.num_classes}, but the CSV names '
                    f'{len(names)} classes; leave num_classes at 0 for them')
  missing = csv_files.missing(files)

  def read(split, input_context, shuffle, seed):
    return csv_files.read_files(files[split], missing, input_context, shuffle,
                                seed)

  return Source('csv', num_classes, len(files['train']), len(files['eval']),
                read, parse=lambda encoded, label, path: (encoded, label, path),
                class_names=names)


# The loader of each non-tfds value of config.dataset (data/kinds.py says
# what the rest of the run asks of each).
_LOADERS = {'tfrecord': _tfrecord_source, 'image_folder': _image_folder_source,
            'csv': _csv_source}
