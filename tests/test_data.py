"""The tfds input path on the bundled digits: splits, shapes, shards, padding."""

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from configs import default
from pipeline import data
from pipeline.errors import UserError


def _config(tfds_dir, **overrides):
  config = default.get_config()
  config.data_dir = tfds_dir
  config.update(overrides)
  return config


def test_digits_source_has_fixed_splits(tfds_dir):
  source = data.load_source(_config(tfds_dir))
  assert source.num_classes == 10
  assert source.eval_split == 'test'  # No validation split: test is held out.
  assert source.num_train_examples + source.num_eval_examples == 1797


def test_train_batches_are_uint8_per_replica(tfds_dir):
  config = _config(tfds_dir)
  source = data.load_source(config)
  context = tf.distribute.InputContext(num_input_pipelines=1,
                                       input_pipeline_id=0,
                                       num_replicas_in_sync=2)
  images, labels = next(iter(data.train_input_fn(config, source, 64)(context)))
  assert images.dtype == tf.uint8 and images.shape == (32, 32, 32, 3)
  assert labels.dtype == tf.int32 and labels.shape == (32,)
  assert int(tf.reduce_max(images)) > 128  # Pixels use uint8's range.


def _eval_examples(config, source, pipelines, global_batch):
  fn = data.eval_input_fn(config, source, global_batch)
  seen = []
  for index in range(pipelines):
    context = tf.distribute.InputContext(pipelines, index, pipelines)
    for images, labels, weights in fn(context):
      seen.extend(zip(images.numpy().reshape(len(labels), -1).sum(1),
                      labels.numpy(), weights.numpy()))
  return seen


@pytest.mark.parametrize('pipelines', [1, 2])
def test_eval_covers_every_example_once(tfds_dir, pipelines):
  config = _config(tfds_dir)
  source = data.load_source(config)
  seen = _eval_examples(config, source, pipelines, global_batch=64)
  assert len(seen) == data.eval_steps(source, 64) * 64
  real = [(s, l) for s, l, w in seen if w == 1.0]
  assert len(real) == source.num_eval_examples
  expected = [(int(tf.reduce_sum(tf.cast(x, tf.int64))), int(y))
              for x, y in _decoded_eval(config, source)]
  assert sorted((int(s), int(l)) for s, l in real) == sorted(expected)


def _decoded_eval(config, source):
  dataset = source.builder.as_dataset(split=source.eval_split,
                                      as_supervised=True)
  return dataset.map(lambda x, y: data._decode(x, y, config.image_size))  # pylint: disable=protected-access


def test_two_workers_read_disjoint_shards(tfds_dir):
  config = _config(tfds_dir, augment='none', train_split='train[:200]')
  source = data.load_source(config)
  shards = []
  for index in range(2):
    context = tf.distribute.InputContext(2, index, 2)
    dataset = data._read(source, source.train_split, context, False, None)  # pylint: disable=protected-access
    shards.append({img.numpy().tobytes() for img, _ in dataset})
  assert shards[0].isdisjoint(shards[1])
  assert len(shards[0]) + len(shards[1]) == 200


def test_unknown_dataset_is_a_user_error(tfds_dir):
  with pytest.raises(UserError, match=r"unknown dataset 'no_such_set'"):
    data.load_source(_config(tfds_dir, dataset='no_such_set'))


def test_missing_split_is_a_user_error(tfds_dir):
  with pytest.raises(UserError, match=r"split 'validation'"):
    data.load_source(_config(tfds_dir, eval_split='validation'))
