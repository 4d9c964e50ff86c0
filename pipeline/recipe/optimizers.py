"""The optimizer and learning-rate schedule a config names.

AdamW (the default), SGD with Nesterov momentum, or tensorflow/tpu's
RMSProp; a linear warmup, then cosine or linear decay to 0, or
tensorflow/tpu's exponential staircase. Weight decay skips batch-norm parameters and biases.
The training step sums gradients across replicas itself, so its optimizer
is told not to sum them again (take_summed_gradients).
"""

import math

import keras
from keras import ops

from pipeline.rules.speed import precision


# The schedules run inside the compiled step of either backend, in keras.ops
# (a TensorFlow op cannot run in JAX's), and choose by `where`, never
# `cond`: on a GPU an XLA conditional copies its predicate to the host and
# waits for it, every step (Keras' CosineDecay with warmup is such a cond).


class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warmup from 0 to `peak` over `warmup_steps`, then cosine decay
  to 0 over `decay_steps`: Keras' CosineDecay(initial_learning_rate=0,
  warmup_target=peak), the same values without its branch."""

  def __init__(self, peak, warmup_steps, decay_steps):
    self.peak, self.warmup_steps = peak, warmup_steps
    self.decay_steps = decay_steps

  def __call__(self, step):
    step = ops.cast(step, 'float32')
    warming = self.peak * step / max(self.warmup_steps, 1)
    done = ops.minimum(ops.maximum(step - self.warmup_steps, 0.0),
                       self.decay_steps) / self.decay_steps
    return ops.where(step < self.warmup_steps, warming,
                     self.peak * self._left(done))

  def _left(self, done):
    """The fraction of the peak left when `done` of the decay is done."""
    return 0.5 * (1.0 + ops.cos(math.pi * done))

  def get_config(self):
    return {'peak': self.peak, 'warmup_steps': self.warmup_steps,
            'decay_steps': self.decay_steps}


class WarmupExponentialDecay(keras.optimizers.schedules.LearningRateSchedule):
  """tensorflow/tpu's EfficientNet schedule (utils.build_learning_rate):
  linear warmup to `peak`, then peak * rate ** floor(step / decay_steps),
  the staircase counted from step 0."""

  def __init__(self, peak, warmup_steps, decay_steps, rate):
    self.peak, self.warmup_steps = peak, warmup_steps
    self.decay_steps, self.rate = decay_steps, rate

  def __call__(self, step):
    step = ops.cast(step, 'float32')
    decayed = self.peak * ops.power(self.rate,
                                    ops.floor(step / self.decay_steps))
    if not self.warmup_steps:
      return decayed
    warming = self.peak * step / self.warmup_steps
    return ops.where(step < self.warmup_steps, warming, decayed)

  def get_config(self):
    return {'peak': self.peak, 'warmup_steps': self.warmup_steps,
            'decay_steps': self.decay_steps, 'rate': self.rate}


class WarmupLinearDecay(WarmupCosineDecay):
  """Linear warmup from 0 to `peak` over `warmup_steps`, then a straight
  line to 0 over `decay_steps` (Keras' PolynomialDecay of power 1 after
  the warmup), 0 after it."""

  def _left(self, done):
    return 1.0 - done


# Each schedule and optimizer by its config name: a new one is a function
# here and a line in its table (validation and the config's docs read the
# names from these tables, through pipeline/recipe/__init__.py).


def _cosine(config, peak, warmup_steps, total_steps, steps_per_epoch):
  del config, steps_per_epoch
  return WarmupCosineDecay(peak, warmup_steps,
                           max(total_steps - warmup_steps, 1))


def _exponential(config, peak, warmup_steps, total_steps, steps_per_epoch):
  del total_steps
  return WarmupExponentialDecay(
      peak, warmup_steps, max(config.lr_decay_epochs * steps_per_epoch, 1.0),
      config.lr_decay_rate)


def _linear(config, peak, warmup_steps, total_steps, steps_per_epoch):
  del config, steps_per_epoch
  return WarmupLinearDecay(peak, warmup_steps,
                           max(total_steps - warmup_steps, 1))


SCHEDULES = {'cosine': _cosine, 'exponential': _exponential,
             'linear': _linear}


def _adamw(config, schedule):
  return keras.optimizers.AdamW(schedule, weight_decay=config.weight_decay)


def _sgd(config, schedule):
  return keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True,
                              weight_decay=config.weight_decay)


def _rmsprop(config, schedule):
  # tensorflow/tpu's RMSProp: decay 0.9, momentum 0.9, epsilon 1e-3, which
  # like Keras' sits inside the square root.
  return keras.optimizers.RMSprop(schedule, rho=0.9, momentum=0.9,
                                  epsilon=1e-3,
                                  weight_decay=config.weight_decay)


OPTIMIZERS = {'adamw': _adamw, 'sgd': _sgd, 'rmsprop': _rmsprop}


def learning_rate_schedule(config, peak, total_steps, steps_per_epoch):
  """The config's lr_schedule (SCHEDULES), after a linear warmup to `peak`
  over warmup_epochs."""
  warmup_steps = min(int(config.warmup_epochs * steps_per_epoch),
                     max(total_steps - 1, 0))
  return SCHEDULES[config.lr_schedule](config, peak, warmup_steps,
                                       total_steps, steps_per_epoch)


def make_optimizer(config, peak, total_steps, steps_per_epoch):
  """The config's optimizer (OPTIMIZERS) on its learning-rate schedule,
  peaking at `peak`.

  `total_steps` and `steps_per_epoch` count updates (an update with
  gradient accumulation takes several micro-batches).
  """
  optimizer = OPTIMIZERS[config.optimizer](
      config, learning_rate_schedule(config, peak, total_steps,
                                     steps_per_epoch))
  # Decay only weight matrices: decaying norms and biases hurts small models.
  optimizer.exclude_from_weight_decay(var_names=['bn', 'bias', 'gamma',
                                                 'beta'])
  return optimizer


def optimizer_of_run(plan):
  """The run's optimizer and schedule, wrapped in a LossScaleOptimizer where
  its policy computes in float16 (rules/speed/precision.py)."""
  config = plan.config
  return precision.wrap_optimizer(
      make_optimizer(config, plan.peak_learning_rate, plan.total_steps,
                     plan.steps_per_epoch),
      plan.policy, plan.hardware.device_kind)


def take_summed_gradients(optimizer):
  """Makes `optimizer.apply` take gradients that are already summed.

  Keras' TensorFlow optimizers sum gradients across replicas inside
  `apply`; our replica step sums them first, so a second sum would multiply
  them by the number of replicas. A loss-scaled optimizer's inner optimizer
  is the one that sums.
  """
  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  if not hasattr(inner, '_all_reduce_sum_gradients'):
    raise RuntimeError(f'{type(inner).__name__} no longer has '
                       '_all_reduce_sum_gradients; update steps.py for this '
                       'Keras version')
  inner._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars  # pylint: disable=protected-access
