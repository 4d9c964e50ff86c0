"""Any tensorflow-datasets image classification set: the source of every
config.dataset no other source takes (sklearn_digits, bundled with
scikit-learn, is the offline default). Read undecoded (SkipDecoding), so
workers shard by file, or by example, before decoding."""

import contextlib
import io
import os

from absl import logging

from pipeline import parts
from pipeline.data.sources import detail as detail_lib
from pipeline.data.sources.source import DataSource
from pipeline.data.sources.source import Source
from pipeline.data.sources.source import UnknownSet
from pipeline.errors import UserError
from pipeline.errors import first_line


# Sets of digits and letters: a mirrored 2 is no 2. Every other set's
# images are taken for photographs, which may be mirrored.
UNMIRRORED = frozenset({
    'sklearn_digits', 'scattered_digits', 'scattered_digits128', 'mnist',
    'emnist', 'kmnist', 'svhn_cropped', 'binary_alpha_digits', 'omniglot',
    'mnist_corrupted'})


class TfdsSet(DataSource):
  """A tensorflow-datasets set, by its name."""
  name = 'a tensorflow-datasets name'
  description = ('any tensorflow-datasets image classification set by its '
                 'name (sklearn_digits, scattered_digits and '
                 'scattered_digits128, bundled with scikit-learn, work '
                 'offline)')
  keys = {
      'data_dir': parts.Key("tfds' data_dir (local or gs://); '' is tfds' "
                            'default'),
      'train_split': parts.Key("tfds' split spec, e.g. 'train[:90%]'"),
      'eval_split': parts.Key("'' takes validation, else test"),
  }

  def names(self):
    return ()  # Every name no other source takes: the table's fallback.

  def inputs(self, settings):
    return {'data_dir': settings.data_dir}

  def held_out(self, settings):
    return settings.eval_split or 'held-out'

  def load(self, settings, prepare=True):
    return _load(settings, prepare)

  def own_augment(self, settings):
    if settings.dataset in UNMIRRORED:
      return 'translate', (f'{settings.dataset} holds digits or letters, '
                           'which a mirror would change')
    return super().own_augment(settings)


def _prepare(builder):
  """download_and_prepare; for the bundled sets, quietly: tfds would print
  "Downloading and preparing dataset Unknown size" and progress bars for
  data that ship with scikit-learn. A real download keeps its display."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfds_set import sklearn_digits  # pylint: disable=g-import-not-at-top
  if builder.name not in sklearn_digits.BUNDLED:
    builder.download_and_prepare()
    return
  chatter = io.StringIO()
  tfds.disable_progress_bar()
  try:
    with contextlib.redirect_stdout(chatter):
      builder.download_and_prepare()
  finally:
    tfds.enable_progress_bar()
  if f'Dataset {builder.name} downloaded and prepared' in chatter.getvalue():
    logging.info('Prepared %s (bundled with scikit-learn) in %s',
                 builder.name, builder.data_dir)


def _load(settings, prepare):
  """The tensorflow-datasets set `settings.dataset` names, prepared; where
  it is not prepared and not `prepare` (a dry run), what its registered
  builder says of it, nothing downloaded or written."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfds_set import sklearn_digits  # pylint: disable=g-import-not-at-top,unused-import  (registers the builders)
  try:
    builder = tfds.builder(settings.dataset,
                           data_dir=settings.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    raise UnknownSet(settings.dataset) from None
  # Its info file, looked up: tfds' is_prepared() warns where it is not.
  prepared = tf.io.gfile.exists(os.path.join(builder.data_dir,
                                             'dataset_info.json'))
  if not prepared and prepare:
    _check_manual_files(builder)
    try:
      _prepare(builder)
    except Exception as e:  # Network, disk and manual-download errors alike.
      raise UserError(f'dataset {settings.dataset!r} could not be prepared '
                      f'in {builder.data_dir}: {_one_line(e)}')
    prepared = True
  features = builder.info.features
  if not ('label' in features and 'image' in features and
          isinstance(features['label'], tfds.features.ClassLabel) and
          isinstance(features['image'], tfds.features.Image)):
    raise UserError(f'dataset {settings.dataset!r} has no image and class '
                    'label; '
                    'it is not an image classification data set')
  if not prepared:
    return _registered(settings, builder, features)
  splits = {'train': settings.train_split,
            'eval': settings.eval_split or _held_out_split(builder)}
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

  def detail():
    fixed = _fixed_detail(settings.dataset, features['image'].shape)
    if fixed.side:
      return fixed
    # Read undecoded: a few MB of the first file's records.
    records = builder.as_dataset(
        split=splits['train'], decoders={'image': tfds.decode.SkipDecoding()})
    return detail_lib.of_encoded(
        (example['image'] for example in
         records.take(detail_lib.SAMPLE).as_numpy_iterator()),
        f'training images (the first of {settings.dataset})')

  return Source(settings.dataset, features['label'].num_classes,
                sizes['train'], sizes['eval'], read,
                parse=lambda image, label, split: (image, label, split),
                class_names=tuple(features['label'].names),
                encoded_bytes=sum(_num_bytes(builder, v)
                                  for v in splits.values()),
                image_side=_fixed_side(features['image'].shape),
                detail=detail)


def _registered(settings, builder, features):
  """An unprepared set as its registered builder describes it: its classes
  and image shape, its sizes unknown until it is prepared (a dry run)."""
  del builder

  def unread(*unused):
    raise UserError(f'dataset {settings.dataset!r} is not prepared')

  return Source(settings.dataset, features['label'].num_classes, 0, 0,
                unread, unread, class_names=tuple(features['label'].names),
                image_side=_fixed_side(features['image'].shape),
                detail=lambda: _fixed_detail(settings.dataset,
                                             features['image'].shape),
                counted=False)


def _fixed_detail(name, shape):
  """The Detail of a set whose feature fixes its image shape, else unknown."""
  height, width = shape[:2]
  if height is None or width is None:
    return detail_lib.UNKNOWN
  return detail_lib.fixed(height, width, f"{name}'s metadata")


def _check_manual_files(builder):
  """A one-line UserError, before anything is created, for a set whose
  files must be downloaded by hand (ImageNet's) where they are not."""
  instructions = getattr(builder, 'MANUAL_DOWNLOAD_INSTRUCTIONS', None)
  if not instructions:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  manual_dir = os.path.join(builder.data_dir_root, 'downloads', 'manual')
  if not (tf.io.gfile.isdir(manual_dir) and tf.io.gfile.listdir(manual_dir)):
    raise UserError(
        f'dataset {builder.name!r} must be downloaded by hand into '
        f'{manual_dir} before its first run: {_one_line(instructions)}; or '
        'point --config.data_dir at a folder where it is prepared')


def _one_line(error_or_text):
  """A message on one line, whole (a builder's instructions: its URL, its
  folder)."""
  return ' '.join(str(error_or_text).split())


def _fixed_side(shape):
  """The longer side of an image feature's (height, width, channels) where
  both are fixed; 0 where either varies (None)."""
  return max(shape[:2]) if None not in shape[:2] else 0


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

