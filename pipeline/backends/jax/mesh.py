"""The data-parallel layout of the JAX backend: every device in one 'batch'
mesh axis, the model replicated, each batch split along its first axis
(Keras calls this DataParallel). JAX and numpy only, no TensorFlow: the
compiled step and its input staging run where TensorFlow is absent (the
probe on a bare GPU image)."""

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


class DataParallel:
  """The devices as one 'batch' mesh axis: the model replicated, each batch
  split along its first axis."""

  def __init__(self, device_list):
    self.mesh = jax.sharding.Mesh(np.array(device_list), ('batch',))
    self.num_replicas_in_sync = len(device_list)
    self.replicated = NamedSharding(self.mesh, PartitionSpec())

  def batch_sharding(self, stacked=False):
    """Batches split over the devices; `stacked`: [steps, batch, ...]."""
    return NamedSharding(self.mesh, PartitionSpec(
        *((None,) if stacked else ()), 'batch'))

  def to_devices(self, host_arrays):
    """Global arrays, split over every device, from this host's share (or
    already there: DALI's GPU batches)."""
    sharding = self.batch_sharding()
    return jax.tree.map(
        lambda a: a if isinstance(a, jax.Array) else
        jax.make_array_from_process_local_data(sharding, a), host_arrays)

  def bytes_per_device(self, arrays):
    """The bytes `arrays` (a tree of global arrays split over the mesh)
    take on one device."""
    return sum(leaf.nbytes for leaf in jax.tree.leaves(arrays)) // (
        self.num_replicas_in_sync)

