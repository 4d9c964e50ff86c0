"""DALI's pipelines (data/dali/) as tf.data datasets, through DALI's
TensorFlow plugin (nvidia-dali-tf-plugin-cuda120, compiled against the
installed TensorFlow as it installs).

One pipeline per replica, each reading its own shard: on GPUs placed on
its GPU (DALI's own recipe for tf.distribute: datasets per replica, on the
device, not fetched again), elsewhere on the CPU. The DALIDataset is the
last link of each chain: DALI's docs warn that most tf.data datasets have a
CPU variant only, so a `.map` after a GPU-placed one would copy every batch
to the host and back. What tf.data's chain does after decoding runs in the
steps instead (steps.py): the label check (decode.LABEL_ERROR, which the
trainer turns into one line) and evaluation's weights, 0 past each shard's
examples (`eval_weights`).
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
  replicas_per_worker = hardware.num_replicas // hardware.num_workers
  size = dali_input.image_size
  # DALI names physical GPUs; --split_gpus makes several logical GPUs
  # (replicas) of each.
  split = max(len(tf.config.list_logical_devices('GPU'))
              // max(len(tf.config.list_physical_devices('GPU')), 1), 1)

  def input_fn(context):
    shard, shards = context.input_pipeline_id, context.num_input_pipelines
    device_id = (shard % replicas_per_worker) // split if on_gpus else None
    batch = dali_input.global_batch_size // shards
    with tf.device(f'/gpu:{device_id}' if on_gpus else '/cpu:0'):
      # DALIDataset builds the pipeline again from its own arguments:
      # threads and depth are passed as the pipeline has them.
      return dali_tf.DALIDataset(
          pipeline=dali_input.pipeline(shard, shards, device_id,
                                       local_pipelines=replicas_per_worker),
          batch_size=batch, device_id=device_id,
          num_threads=dali_input.threads(replicas_per_worker),
          prefetch_queue_depth=dali_input.prefetch_depth,
          output_shapes=((batch, size, size, 3), (batch,)),
          output_dtypes=(tf.uint8, tf.int32))

  return hardware.strategy.distribute_datasets_from_function(
      input_fn, tf.distribute.InputOptions(
          experimental_place_dataset_on_device=on_gpus,
          experimental_fetch_to_device=not on_gpus,
          experimental_replication_mode=(
              tf.distribute.InputReplicationMode.PER_REPLICA)))


def label_check(num_classes, files):
  """A replica's labels -> the same labels, checked in [0, num_classes)
  as tf.data's are (the step runs it before the model)."""
  origin = f'a record of {dali.files_named(files)}'

  def check(labels):
    bad = (labels < 0) | (labels >= num_classes)
    first = tf.gather(labels, tf.argmax(tf.cast(bad, tf.int32)))
    check_ = tf.debugging.Assert(~tf.reduce_any(bad),
                                 [decode.LABEL_ERROR, first, origin])
    with tf.control_dependencies([check_]):
      return tf.identity(labels)
  return check


def eval_weights(num_examples, num_replicas, global_batch_size):
  """(batch index, replica) -> that replica's weights: 1 for the examples
  of its shard, 0 for the padding DALI repeats past them (the DALI eval
  input yields images and labels only)."""
  per_replica = global_batch_size // num_replicas
  sizes = tf.constant([dali.shard_size(num_examples, shard, num_replicas)
                       for shard in range(num_replicas)], tf.int64)

  def weights(index, replica):
    first = tf.cast(index, tf.int64) * per_replica
    return tf.cast(first + tf.range(per_replica, dtype=tf.int64)
                   < tf.gather(sizes, replica), tf.float32)
  return weights
