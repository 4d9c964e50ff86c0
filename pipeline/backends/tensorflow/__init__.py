"""Keras on TensorFlow: CPUs, GPUs, and the TPUs TensorFlow's TPU build reaches.

tf.distribute strategies (devices.py; several machines: workers.py),
multi-step tf.functions (steps.py) under a Trainer (trainer.py), the
moving average as replica-local variables (ema.py), XLA's rules (xla.py),
its persistent caches (compile_cache.py), TPU Nodes' runtime versions
(tpu_runtime.py), --policy=rewrite's graph rewrite (graph_rewrite.py),
DALI's TensorFlow plugin (dali_input.py).
Checkpoints are tf.train.Checkpoint's files. Modules here import
TensorFlow; this one does not, so the choice of backend stays light.
"""

import time

from pipeline import backends
from pipeline.storage import checkpoint_format


class TensorFlowBackend:
  """The Backend interface on TensorFlow (pipeline/backends/interface.py)."""
  name = 'tensorflow'
  checkpoint_format = checkpoint_format.Format.TF_CHECKPOINT

  def software(self):
    tf = next(filter(None, map(backends.installed, (
        'tensorflow', 'tensorflow-cpu', 'tensorflow-tpu'))), 'unknown')
    cudnn = backends.installed('nvidia-cudnn-cu12')
    return f'tf-{tf}' + (f'-cudnn-{cudnn}' if cudnn else '')

  def compile_cache(self, setting, environ, gpus, accelerator, versions):
    del accelerator  # TPUs compile in their runtime; GPUs key the folder.
    from pipeline.backends.tensorflow import compile_cache  # pylint: disable=g-import-not-at-top
    return compile_cache.choose(setting, environ, gpus, versions)

  def check_compile_cache(self, directory):
    """Sets damaged entries aside (also in a folder named in TF_XLA_FLAGS)."""
    from pipeline.backends.tensorflow import compile_cache  # pylint: disable=g-import-not-at-top
    compile_cache.set_aside_damaged(directory)

  def resolve_hardware(self, request):
    from pipeline.backends.tensorflow import devices  # pylint: disable=g-import-not-at-top
    return devices.resolve(
        request.tpu, request.tpu_zone, request.gcp_project,
        request.num_cpu_devices, request.collective,
        request.collective_timeout_s, request.gpus,
        request.tpu_runtime_version, request.allow_cpu, request.split_gpus)

  def policy(self, requested, policy, reason):
    del requested  # TensorFlow runs every policy the rule picks.
    return policy, reason

  def choose_xla(self, requested, hardware, policy):
    from pipeline.backends.tensorflow import xla  # pylint: disable=g-import-not-at-top
    return xla.choose_xla(requested, hardware, policy)

  def build_trainer(self, plan):
    from pipeline.backends.tensorflow import trainer  # pylint: disable=g-import-not-at-top
    return trainer.build(plan)

  def distribute(self, hardware, batches):
    from pipeline.data import dali  # pylint: disable=g-import-not-at-top
    if isinstance(batches, dali.Input):
      from pipeline.backends.tensorflow import dali_input as dali_lib  # pylint: disable=g-import-not-at-top
      return dali_lib.distribute(hardware, batches)
    return hardware.strategy.distribute_datasets_from_function(
        batches.input_fn)

  def repeated(self, hardware, images, labels, delay_s=0.0):
    """Through tf.data, cached: TensorFlow's distributed iterator copies
    each step's batch to the devices (prefetched, alongside the step)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    batch = len(images) * hardware.num_workers

    def late(*batch):
      waited = tf.numpy_function(lambda: time.sleep(delay_s) or 0.0, [],
                                 tf.float64)
      with tf.control_dependencies([waited]):
        return tuple(tf.identity(part) for part in batch)

    def input_fn(context):
      per_replica = context.get_per_replica_batch_size(batch)
      one = tf.data.Dataset.from_tensors(
          (images[:per_replica], labels[:per_replica])).cache().repeat()
      return one.map(late) if delay_s else one
    return hardware.strategy.distribute_datasets_from_function(input_fn)

  def sum_over_workers(self, hardware):
    from pipeline.backends.tensorflow import workers  # pylint: disable=g-import-not-at-top
    return workers.sum_over_workers(hardware.strategy)

  def profiler(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.profiler.experimental.start, tf.profiler.experimental.stop

  def export(self, task, model, metadata, path, *args, io_device=None):
    from pipeline.backends import tensorflow_exports  # pylint: disable=g-import-not-at-top
    return tensorflow_exports.write(task, model, metadata, path, *args,
                                    io_device=io_device)

  def peak_device_memory(self, hardware):
    if hardware.device_kind not in ('GPU', 'TPU'):
      return None
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
      return int(tf.config.experimental.get_memory_info(
          f'{hardware.device_kind}:0')['peak'])
    except (ValueError, tf.errors.OpError):
      return None  # Not tracked on this device.


BACKEND = TensorFlowBackend()
