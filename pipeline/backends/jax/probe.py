"""What the JAX route does on whatever accelerator JAX sees, measured in a
few minutes with nothing but JAX and Keras: launch.probe.

Stages, most decisive first, each written to `probe.json` as it ends (a
run cut off still returns what it measured):

  a  compile time and images/s on batches already on the devices
  b  images/s fed from host uint8 arrays through staging, for the loop as
     it was (one program per execution, a `fori_loop` of a runtime trip
     count) and as it is (one program per step): input wait, how long the
     dispatches of an execution take to return, and the rate against (a)'s
  c  the device's memory limit, the compiled step's memory, and the input
     held beside it at two steps_per_execution
  d  FLOPs per image: the compiled program's count beside the unoptimized
     program's, and the custom calls the compiled one holds
  e  float16 with dynamic loss scaling: images/s, final scale, skipped steps
  f  Keras' own model.fit on the same model, batch and policy

A stage that would not end within the budget is skipped with its reason.
Imports no TensorFlow: it runs on a bare JAX image plus a few wheels.
"""

import time

import jax
import jax.numpy as jnp
import keras
import numpy as np

from pipeline.backends.jax import ema as ema_lib
from pipeline.backends.jax import mesh
from pipeline.backends.jax import programs
from pipeline.backends.jax import probe_stages
from pipeline.recipe import models
from pipeline.recipe import moving_average

STAGES = 'abcdef'


class Setup:
  """The model, optimizer and programs of one policy, built as a run
  builds them (programs.py), over every device JAX sees."""

  def __init__(self, config, num_classes, policy, strategy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(config.seed)
    self.config, self.num_classes, self.strategy = config, num_classes, strategy
    self.model = models.build_model(
        config.model, num_classes, config.image_size, config.dropout_rate,
        config.batch_norm_momentum, config.drop_connect_rate)
    self.optimizer = probe_stages.make_optimizer(config, policy)
    self.optimizer.build(self.model.trainable_variables)
    self.ema = (ema_lib.MovingAverage(self.model, config.ema_decay)
                if config.ema_decay else None)
    self.step = programs.train_step(
        self.model, self.optimizer, config, num_classes, strategy, self.ema)

  def state(self):
    return programs.initial_state(
        self.model, self.optimizer, self.strategy, np.int32(0),
        [v.value for v in moving_average.averaged(self.model)]
        if self.ema else None)

  def as_it_was(self):
    """The train program as it was: one program per execution, a loop over
    the first `num_steps` of its batches stacked on the devices, a trip
    count known only at run time; with the stacking (state, batches) ->
    (state, outputs), as the trainer's step is called."""
    one_step = programs.step_function(
        self.model, self.optimizer, self.config, self.num_classes, self.ema,
        False, self.config.gradient_accumulation_steps)

    def train(state, images, labels, num_steps):
      def body(index, carry):
        state, loss = carry
        state, (step_loss, _) = one_step(state, (images[index], labels[index]))
        return state, loss + step_loss
      return jax.lax.fori_loop(0, num_steps, body, (state, 0.0))

    program = jax.jit(train, donate_argnums=0,
                      out_shardings=self.strategy.replicated)
    stack = jax.jit(lambda batches: tuple(map(jnp.stack, zip(*batches))),
                    out_shardings=self.strategy.batch_sharding(stacked=True))
    return lambda state, batches: program(state, *stack(batches),
                                          np.int32(len(batches)))


class Probe:
  """The stages over one set of host batches, the figures so far in
  `results`, saved by `save` after each."""

  def __init__(self, config, num_classes, steps_per_execution, executions,
               budget_s, save):
    self.config, self.num_classes = config, num_classes
    self.slots, self.executions = steps_per_execution, executions
    self.start, self.budget_s, self.save = time.perf_counter(), budget_s, save
    self.strategy = mesh.DataParallel(jax.devices())
    self.device = jax.devices()[0]
    batch, size = config.global_batch_size, config.image_size
    rng = np.random.default_rng(0)
    # A few distinct host batches, cycled: the host's cost is the copy.
    self.host_batches = [
        (rng.integers(0, 256, (batch, size, size, 3), np.uint8),
         rng.integers(0, num_classes, (batch,), np.int32)) for _ in range(4)]
    self.results = {'machine': machine(self.device), 'stages': {}}
    self.compile_s = None  # (a)'s, what later stages are predicted by.
    self.device_images_per_sec = None  # (a)'s.
    self.setups = {}

  def left_s(self):
    return self.budget_s - (time.perf_counter() - self.start)

  def setup(self, policy):
    if policy not in self.setups:
      self.setups[policy] = Setup(self.config, self.num_classes, policy,
                                  self.strategy)
    return self.setups[policy]

  def on_devices(self, steps):
    return [self.strategy.to_devices(self.host_batches[i % 4])
            for i in range(steps)]

  def host_stream(self):
    while True:
      yield from self.host_batches

  def images(self, executions, slots=None):
    return executions * (slots or self.slots) * self.config.global_batch_size

  def run(self, stages, policy):
    """Runs `stages` (letters of STAGES) in order, (a) first whatever they
    say (the others read its program and rate); returns the results."""
    for letter in 'a' + stages.replace('a', ''):
      name, stage, compiles = _STAGES[letter]
      needs_s = (self.compile_s or 60.0) * compiles * 1.5
      if letter != 'a' and self.left_s() < needs_s:
        figures = {'skipped': f'{self.left_s():.0f} s of the budget left; '
                              f'it needs about {needs_s:.0f} s'}
      else:
        began = time.perf_counter()
        try:
          figures = stage(self, policy)
        except Exception as e:  # pylint: disable=broad-except
          figures = {'failed': f'{type(e).__name__}: {str(e)[:400]}'}
        figures['seconds'] = round(time.perf_counter() - began, 1)
      self.results['stages'][f'{letter}_{name}'] = figures
      self.results['elapsed_s'] = round(time.perf_counter() - self.start, 1)
      self.save(self.results)
    return self.results


def machine(device):
  """What ran the probe, as JAX and Keras see it."""
  stats = device.memory_stats() or {}
  return {'platform': device.platform, 'device_kind': device.device_kind,
          'devices': jax.device_count(), 'hosts': jax.process_count(),
          'jax': jax.__version__, 'keras': keras.__version__,
          'memory_limit_bytes': stats.get('bytes_limit'),
          'compute_capability': getattr(device, 'compute_capability', None)}


# letter: (name, stage, compilations it makes).
_STAGES = probe_stages.BY_LETTER
