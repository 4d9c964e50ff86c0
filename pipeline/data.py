"""tf.data input from tensorflow-datasets, built per worker.

Order matters (guide §1.9): decode and resize once, cache, then shuffle,
random augmentation, batch and prefetch, so augmentation differs every epoch.
Images stay uint8 until they reach the device, where the model casts them.
Every input function takes a tf.distribute.InputContext, so each worker reads
its own shard and batches are per replica.
"""

import dataclasses

import tensorflow as tf
import tensorflow_datasets as tfds

from pipeline import sklearn_digits  # pylint: disable=unused-import  (registers the builder)
from pipeline.errors import UserError

AUTOTUNE = tf.data.AUTOTUNE
AUGMENTATIONS = ('none', 'translate', 'translate_flip')


@dataclasses.dataclass(frozen=True)
class Source:
  """A prepared tfds data set and the splits a run reads."""
  builder: tfds.core.DatasetBuilder
  train_split: str
  eval_split: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int


def load_source(config):
  """Finds and prepares `config.dataset`; a UserError if that cannot work."""
  try:
    builder = tfds.builder(config.dataset, data_dir=config.data_dir or None)
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(f'unknown dataset {config.dataset!r}; accepted: any '
                    'tensorflow-datasets image classification name, e.g. '
                    'sklearn_digits (offline), cifar10, imagenet2012')
  try:
    builder.download_and_prepare()
  except Exception as e:  # Network, disk and manual-download errors alike.
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise UserError(f'dataset {config.dataset!r} could not be prepared in '
                    f'{builder.data_dir}: {first_line}')
  features = builder.info.features
  if 'label' not in features or not hasattr(features['label'], 'num_classes'):
    raise UserError(f'dataset {config.dataset!r} has no class label; it is '
                    'not an image classification data set')
  eval_split = config.eval_split or _held_out_split(builder)
  return Source(builder, config.train_split, eval_split,
                num_classes=features['label'].num_classes,
                num_train_examples=_num_examples(builder, config.train_split),
                num_eval_examples=_num_examples(builder, eval_split))


def _held_out_split(builder):
  for name in ('validation', 'test'):
    if name in builder.info.splits:
      return name
  raise UserError(f'dataset {builder.name!r} has no validation or test split; '
                  'set --config.eval_split (e.g. "train[90%:]") and '
                  '--config.train_split (e.g. "train[:90%]")')


def _num_examples(builder, split):
  try:
    return builder.info.splits[split].num_examples
  except (KeyError, ValueError) as e:
    raise UserError(f'split {split!r} does not exist in {builder.name!r} '
                    f'(splits: {", ".join(builder.info.splits)}): {e}')


def _read(source, split, input_context, shuffle_files, seed):
  """The examples of this input pipeline's shard, as (image, label)."""
  pipelines = input_context.num_input_pipelines
  num_files = source.builder.info.splits[split].num_shards
  by_file = pipelines > 1 and num_files >= pipelines
  read_config = tfds.ReadConfig(
      input_context=input_context if by_file else None,
      shuffle_seed=seed, try_autocache=False)
  dataset = source.builder.as_dataset(
      split=split, as_supervised=True, read_config=read_config,
      shuffle_files=shuffle_files and (by_file or pipelines == 1))
  if pipelines > 1 and not by_file:
    # Fewer files than workers: every worker reads all, keeps every n-th.
    dataset = dataset.shard(pipelines, input_context.input_pipeline_id)
  return dataset


def _decode(image, label, image_size):
  """Any-channel image -> uint8 [size, size, 3], resized once (cached after)."""
  image = image[..., :3]  # Drop alpha.
  if image.shape[-1] == 1:
    image = tf.image.grayscale_to_rgb(image)
  image = tf.image.resize(image, (image_size, image_size), antialias=True)
  image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
  return image, tf.cast(label, tf.int32)


def _augment(image, label, kind, image_size):
  if kind in ('translate', 'translate_flip'):
    pad = max(image_size // 8, 1)
    image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    image = tf.image.random_crop(image, (image_size, image_size, 3))
  if kind == 'translate_flip':
    image = tf.image.random_flip_left_right(image)
  return image, label


def _cache(dataset, cache):
  if cache == 'memory':
    return dataset.cache()
  if cache:
    return dataset.cache(cache)
  return dataset


def train_input_fn(config, source, global_batch_size):
  """An input function for strategy.distribute_datasets_from_function."""
  if config.augment not in AUGMENTATIONS:
    raise UserError(f'unknown augment {config.augment!r}; accepted: '
                    f'{", ".join(AUGMENTATIONS)}')
  seed = config.seed if config.deterministic_input else None

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = _read(source, source.train_split, input_context, True, seed)
    dataset = dataset.map(lambda x, y: _decode(x, y, config.image_size),
                          num_parallel_calls=AUTOTUNE)
    dataset = _cache(dataset, config.cache)
    buffer = min(config.shuffle_buffer, source.num_train_examples)
    dataset = dataset.shuffle(buffer, seed=seed).repeat()
    dataset = dataset.map(
        lambda x, y: _augment(x, y, config.augment, config.image_size),
        num_parallel_calls=AUTOTUNE)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.deterministic = config.deterministic_input
    return dataset.with_options(options).prefetch(AUTOTUNE)

  return input_fn


def eval_steps(source, global_batch_size):
  """Steps that cover every held-out example once (the last batch padded)."""
  return -(-source.num_eval_examples // global_batch_size)


def eval_input_fn(config, source, global_batch_size):
  """Held-out examples as (image, label, weight), padded to full batches.

  Padding examples carry weight 0, so every example counts exactly once while
  every batch keeps the static shape TPUs need.
  """
  padded_total = eval_steps(source, global_batch_size) * global_batch_size

  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = source.builder.as_dataset(split=source.eval_split,
                                        as_supervised=True)
    dataset = dataset.map(lambda x, y: _decode(x, y, config.image_size) + (1.0,),
                          num_parallel_calls=AUTOTUNE)
    padding = tf.data.Dataset.from_tensors(
        (tf.zeros((config.image_size,) * 2 + (3,), tf.uint8), 0, 0.0)).repeat(
            padded_total - source.num_eval_examples)
    dataset = dataset.concatenate(padding).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.cache().batch(batch_size, drop_remainder=True)
    return dataset.prefetch(AUTOTUNE)

  return input_fn
