"""DALI's pipelines (data/dali.py) as tf.data datasets, through DALI's
TensorFlow plugin (nvidia-dali-tf-plugin-cuda120, compiled against the
installed TensorFlow as it installs).

On GPUs one pipeline per replica, placed on its GPU (DALI's own recipe for
tf.distribute: datasets per replica, on the device, not fetched again);
elsewhere one per worker, on its CPU. Labels are checked as tf.data's
(decode.LABEL_ERROR, which the trainer turns into one line); evaluation
pads each shard to full batches with weight-0 examples.
"""

import tensorflow as tf

from pipeline.data import dali
from pipeline.data import decode
from pipeline.errors import UserError


def distribute(hardware, dali_input):
  if hardware.device_kind == 'TPU':
    raise UserError('--config.input_pipeline=dali feeds GPUs (and CPUs); a '
                    'TPU on TensorFlow reads tf.data (--config.input_pipeline'
                    '=tf.data), or train on --backend=jax, whose hosts run '
                    'DALI on their CPUs')
  try:
    from nvidia.dali.plugin import tf as dali_tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UserError(
        '--config.input_pipeline=dali on TensorFlow needs DALI and its '
        'TensorFlow plugin (pip install --no-build-isolation -r '
        'requirements-dali-tf.txt, which compiles it against this '
        'TensorFlow), or --backend=jax, which feeds DALI through its JAX '
        f'plugin ({e})') from None
  on_gpus = hardware.device_kind == 'GPU'
  gpus_per_worker = hardware.num_replicas // hardware.num_workers
  size = dali_input.image_size

  def input_fn(context):
    shard, shards = context.input_pipeline_id, context.num_input_pipelines
    device_id = shard % gpus_per_worker if on_gpus else None
    batch = dali_input.global_batch_size // shards
    with tf.device(f'/gpu:{device_id}' if on_gpus else '/cpu:0'):
      dataset = dali_tf.DALIDataset(
          pipeline=dali_input.pipeline(shard, shards, device_id),
          batch_size=batch, device_id=device_id,
          output_shapes=((batch, size, size, 3), (batch,)),
          output_dtypes=(tf.uint8, tf.int32))
    dataset = dataset.map(_checked_labels(dali_input))
    if dali_input.training:
      return dataset
    shard_size = dali_input.shard_size(shard, shards)
    return dataset.enumerate().map(
        lambda position, batch_: (*batch_, tf.cast(
            position * batch + tf.range(batch, dtype=tf.int64) < shard_size,
            tf.float32)))

  options = (tf.distribute.InputOptions(
      experimental_place_dataset_on_device=True,
      experimental_fetch_to_device=False,
      experimental_replication_mode=(
          tf.distribute.InputReplicationMode.PER_REPLICA))
             if on_gpus else None)
  return hardware.strategy.distribute_datasets_from_function(input_fn,
                                                             options)


def _checked_labels(dali_input):
  origin = f'a record of {dali.files_named(dali_input.files)}'

  def check(images, labels):
    bad = (labels < 0) | (labels >= dali_input.num_classes)
    first = tf.gather(labels, tf.argmax(tf.cast(bad, tf.int32)))
    check_ = tf.debugging.Assert(~tf.reduce_any(bad),
                                 [decode.LABEL_ERROR, first, origin])
    with tf.control_dependencies([check_]):
      return tf.identity(images), tf.identity(labels)
  return check
