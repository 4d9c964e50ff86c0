"""The stripes as records: PNG bytes, the label, an origin."""

import tensorflow as tf

from pipeline.data.sources.source import Source


def _image(index):
  """A 48 px PNG of stripes, vertical for an even index."""
  stripes = tf.cast(tf.range(48) // 4 % 2 * 255, tf.uint8)
  rows = tf.tile(stripes[None, :, None], [48, 1, 3])
  image = tf.where(index % 2 == 0, rows, tf.transpose(rows, [1, 0, 2]))
  return tf.io.encode_png(image)


def load(num_train_examples):
  num_eval_examples = num_train_examples // 4

  def read(split, input_context, shuffle, seed):
    count = num_train_examples if split == 'train' else num_eval_examples
    indices = tf.data.Dataset.range(count).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
      indices = indices.shuffle(count, seed=seed)
    return indices.map(lambda i: (_image(i), tf.cast(i % 2, tf.int32),
                                  tf.strings.as_string(i)))

  return Source('stripes', 2, num_train_examples, num_eval_examples, read,
                parse=lambda encoded, label, origin: (encoded, label, origin),
                class_names=('vertical', 'horizontal'))
