"""Any tensorflow-datasets image classification set: the source of every
config.dataset no other source takes (sklearn_digits, bundled with
scikit-learn, is the offline default). Read undecoded (SkipDecoding), so
workers shard by file, or by example, before decoding."""

import contextlib
import io

from absl import logging

from pipeline import parts
from pipeline.data.sources.source import DataSource
from pipeline.data.sources.source import Source
from pipeline.data.sources.source import UnknownSet
from pipeline.errors import UserError
from pipeline.errors import first_line


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

  def load(self, settings):
    return _load(settings)


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


def _load(settings):
  """The tensorflow-datasets set `settings.dataset` names, prepared."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfds_set import sklearn_digits  # pylint: disable=g-import-not-at-top,unused-import  (registers the builders)
  try:
    builder = tfds.builder(settings.dataset,
                           data_dir=settings.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    raise UnknownSet(settings.dataset) from None
  try:
    _prepare(builder)
  except Exception as e:  # Network, disk and manual-download errors alike.
    raise UserError(f'dataset {settings.dataset!r} could not be prepared in '
                    f'{builder.data_dir}: {first_line(e)}')
  features = builder.info.features
  if not ('label' in features and 'image' in features and
          isinstance(features['label'], tfds.features.ClassLabel) and
          isinstance(features['image'], tfds.features.Image)):
    raise UserError(f'dataset {settings.dataset!r} has no image and class '
                    'label; '
                    'it is not an image classification data set')
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

  return Source(settings.dataset, features['label'].num_classes,
                sizes['train'], sizes['eval'], read,
                parse=lambda image, label, split: (image, label, split),
                class_names=tuple(features['label'].names),
                encoded_bytes=sum(_num_bytes(builder, v)
                                  for v in splits.values()),
                image_side=_fixed_side(features['image'].shape))


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

