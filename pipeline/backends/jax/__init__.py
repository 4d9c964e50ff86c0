"""Keras on JAX: today's TPUs (Colab, TPU7x), and any device JAX sees.

One data-parallel mesh over every device of every host (mesh.py), one
jitted program per step, dispatched a step at a time (programs.py), under
a Trainer (trainer.py) whose state is one pytree of JAX arrays
(train_state.py), the moving average as one vector (ema.py), the host
staging the next execution's input (staging.py), devices and hosts
(devices.py), DALI's JAX plugin (dali_input.py). Checkpoints are Keras'
`.weights.h5` files,
which a TensorFlow machine reads too. tf.data (TensorFlow's CPU build)
feeds it. Modules here import JAX; this one does not, so the choice of
backend stays light.
"""

import os
import time

from pipeline import backends
from pipeline.storage import checkpoint_format
from pipeline.errors import UserError
from pipeline.rules.speed import compile_cache as compile_cache_lib

JAX_CACHE_VARIABLE = 'JAX_COMPILATION_CACHE_DIR'
# JAX caches only programs that took a second to compile; a Keras model's
# set-up compiles some two hundred small ones (an initializer a weight
# shape, the eager ops), 11 s a start for B0 on a CPU, each paid again on
# every restart after a preemption. Cached too (kilobytes each), a
# restart reads them back: 34 s -> 27 s a run here (BUILD_NOTES.md).
SMALL_PROGRAMS = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
                  'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}


class JaxBackend:
  """The Backend interface on JAX (pipeline/backends/interface.py)."""
  name = 'jax'
  checkpoint_format = checkpoint_format.Format.KERAS_WEIGHTS

  def software(self):
    # cuDNN's own wheel where JAX's CUDA plugin brought one: its kernels
    # are what XLA's convolution picks name.
    cudnn = next(filter(None, map(backends.installed, (
        'nvidia-cudnn-cu13', 'nvidia-cudnn-cu12'))), None)
    return f'jax-{backends.installed("jaxlib")}' + (
        f'-cudnn-{cudnn}' if cudnn else '')

  def compile_cache(self, setting, environ, gpus, accelerator, versions):
    del gpus  # JAX keys its entries by device and software itself.
    # The user's own thresholds stand.
    small = {k: v for k, v in SMALL_PROGRAMS.items() if k not in environ}
    if environ.get(JAX_CACHE_VARIABLE):
      return compile_cache_lib.Settings(setting, environ[JAX_CACHE_VARIABLE],
                                        f'your {JAX_CACHE_VARIABLE}', small)
    if not setting and not accelerator:
      return compile_cache_lib.off_on_a_cpu(setting)
    folder = os.path.expanduser(setting) or os.path.join(
        compile_cache_lib.root(), compile_cache_lib.slug(versions))
    return compile_cache_lib.Settings(
        setting, folder, compile_cache_lib.first_run(setting, 'JAX version'),
        {JAX_CACHE_VARIABLE: folder, **small})

  def check_compile_cache(self, directory):
    del directory  # JAX passes over an entry it cannot read by itself.

  def resolve_hardware(self, request):
    from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top
    return devices.resolve(request)

  def policy(self, requested, policy, reason):
    """Every policy but the graph rewrite, which is TensorFlow's (grappler);
    float16 trains with Keras' LossScaleOptimizer in the compiled program,
    as on TensorFlow."""
    if requested == 'rewrite':
      raise UserError('--policy=rewrite is TensorFlow\'s graph rewrite and '
                      'runs on --backend=tensorflow only; on JAX use auto, '
                      'mixed_float16, mixed_bfloat16 or float32')
    return policy, reason

  def choose_xla(self, requested, hardware, policy):
    del hardware, policy
    if requested == 'off':
      raise UserError('--xla=off: JAX compiles every program with XLA; use '
                      '--backend=tensorflow to train without it')
    return True, 'JAX compiles every program with XLA'

  def build_trainer(self, plan):
    from pipeline.backends.jax import trainer  # pylint: disable=g-import-not-at-top
    return trainer.build(plan)

  def distribute(self, hardware, batches):
    from pipeline.data import dali  # pylint: disable=g-import-not-at-top
    if isinstance(batches, dali.Input):
      from pipeline.backends.jax import dali_input as dali_lib  # pylint: disable=g-import-not-at-top
      return dali_lib.DaliBatches(hardware.strategy, batches)
    from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top
    return devices.host_batches(batches.input_fn)

  def repeated(self, hardware, images, labels, delay_s=0.0):
    return _Repeated(hardware.strategy.to_devices((images, labels)), delay_s)

  def sum_over_workers(self, hardware):
    del hardware
    from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top
    return devices.sum_over_hosts

  def profiler(self):
    import jax  # pylint: disable=g-import-not-at-top
    return jax.profiler.start_trace, jax.profiler.stop_trace

  def export(self, task, model, metadata, path, *args, io_device=None):
    del io_device  # TPU Nodes only, which JAX does not drive.
    from pipeline.backends import tensorflow_exports  # pylint: disable=g-import-not-at-top
    # On Keras' TensorFlow backend, in a child process, from the weights.
    return tensorflow_exports.on_tensorflow(
        task, model.get_weights(),
        dict(metadata, policy=model.dtype_policy.name), path, *args)

  def peak_device_memory(self, hardware):
    if hardware.device_kind == 'CPU':
      return None
    import jax  # pylint: disable=g-import-not-at-top
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get('peak_bytes_in_use')


class _Repeated:
  """The same batch, already on the devices, from every iterator, each
  `delay_s` late."""

  def __init__(self, batch, delay_s):
    self.batch, self.delay_s = batch, delay_s

  def __iter__(self):
    while True:
      if self.delay_s:
        time.sleep(self.delay_s)
      yield self.batch


BACKEND = JaxBackend()
