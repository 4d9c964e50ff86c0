"""DALI's pipelines (data/dali.py) onto the data-parallel mesh, through
DALI's JAX plugin.

On GPUs one pipeline per local GPU decodes on it (nvJPEG) and the plugin
assembles each batch as one global array split over the mesh: the images
never touch the host. Elsewhere one pipeline per host decodes on its CPU
and the batch goes to the devices as tf.data's does (DataParallel's
to_devices). Labels are checked on the host (a few bytes per batch).
Evaluation pads each shard to full batches with weight-0 examples, as
tf.data's eval input does.
"""

import numpy as np

from pipeline.data import dali
from pipeline.errors import UserError


class DaliBatches:
  """Batches of one split, a fresh pass (new pipelines) per iter()."""

  def __init__(self, strategy, dali_input):
    self.strategy = strategy
    self.input = dali_input

  def __iter__(self):
    import jax  # pylint: disable=g-import-not-at-top
    try:
      from nvidia.dali.plugin import jax as dali_jax  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise UserError(f'--config.input_pipeline=dali: DALI is not installed; '
                      f'{dali.INSTALL}') from None
    devices = list(self.strategy.mesh.devices.flat)
    on_gpus = devices[0].platform in ('gpu', 'cuda', 'rocm')
    if on_gpus:  # One shard per device of the mesh; this host's build.
      shards = [(devices.index(d), d.local_hardware_id)
                for d in devices if d.process_index == jax.process_index()]
      num_shards, sharding = len(devices), self.strategy.batch_sharding()
    else:
      shards = [(jax.process_index(), None)]
      num_shards, sharding = jax.process_count(), None
    pipelines = [self.input.pipeline(shard, num_shards, device_id,
                                     local_pipelines=len(shards))
                 for shard, device_id in shards]
    iterator = self._run(dali_jax.DALIGenericIterator(
        pipelines, ['images', 'labels'], sharding=sharding,
        prepare_first_batch=False))
    return self._batches(iterator, [shard for shard, _ in shards],
                         num_shards, on_gpus)

  def _run(self, iterator):
    while True:
      try:
        batch = next(iterator)
      except RuntimeError as e:
        message = dali.failure_message(e, self.input.files)
        if message:
          raise UserError(message) from None
        raise
      yield batch['images'], batch['labels']

  def _batches(self, iterator, local_shards, num_shards, on_gpus):
    source = self.input
    per_shard = source.global_batch_size // num_shards
    for position, (images, labels) in enumerate(iterator):
      dali.check_labels(
          np.concatenate([np.asarray(s.data)
                          for s in labels.addressable_shards]),
          source.num_classes, source.label_offset, source.files)
      if not on_gpus:  # A host batch, for DataParallel.to_devices.
        images, labels = np.asarray(images), np.asarray(labels)
      if source.training:
        yield images, labels
        continue
      # This host's share of the weights: 0 past each shard's examples.
      first = position * per_shard + np.arange(per_shard)
      yield images, labels, np.concatenate([
          first < source.shard_size(shard, num_shards)
          for shard in local_shards]).astype(np.float32)
