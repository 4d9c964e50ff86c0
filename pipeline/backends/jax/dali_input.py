"""DALI's pipelines (data/dali/) onto the data-parallel mesh, through
DALI's JAX plugin.

One pipeline per local device of the mesh reads its shard of the records.
On GPUs each decodes on its GPU (nvJPEG) and the plugin assembles each
batch as one global array split over the mesh: the images never touch the
host. Elsewhere they decode on the host's CPU and the plugin stacks their
batches there, which go to the devices as tf.data's do (DataParallel's
to_devices). The iterator over several pipelines learns each shard's size
from the reader (`reader_name`: DALI refuses an unsized iterator over more
than one) and starts the next epoch by itself, a stream without end as
tf.data's repeated input. Labels are checked on the host (a few bytes per
batch).
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
    # One shard per device of the mesh; this host's build their pipelines.
    shards = [(devices.index(d), d.local_hardware_id if on_gpus else None)
              for d in devices if d.process_index == jax.process_index()]
    pipelines = [self.input.pipeline(shard, len(devices), device_id,
                                     local_pipelines=len(shards))
                 for shard, device_id in shards]
    iterator = self._run(dali_jax.DALIGenericIterator(
        pipelines, ['images', 'labels'], reader_name=dali.READER,
        auto_reset=True, prepare_first_batch=False,
        sharding=self.strategy.batch_sharding() if on_gpus else None))
    return self._batches(iterator, [shard for shard, _ in shards],
                         len(devices), on_gpus)

  def _run(self, iterator):
    while True:
      try:
        batch = next(iterator)
      except StopIteration:  # An epoch's end: the iterator reset itself.
        continue
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
      if not on_gpus:  # A host batch, for DataParallel.to_devices (the
        # plugin stacks several pipelines' as [pipelines, batch, ...]).
        images, labels = (np.asarray(a) for a in (images, labels))
        if len(local_shards) > 1:
          images, labels = (a.reshape(-1, *a.shape[2:])
                            for a in (images, labels))
      if source.training:
        yield images, labels
        continue
      # This host's share of the weights: 0 past each shard's examples.
      first = position * per_shard + np.arange(per_shard)
      yield images, labels, np.concatenate([
          first < source.shard_size(shard, num_shards)
          for shard in local_shards]).astype(np.float32)
