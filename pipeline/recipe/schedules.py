"""The learning-rate schedules config.lr_schedule names, each one object in
SCHEDULES: a linear warmup to the peak over warmup_epochs, then cosine or
linear decay to 0, or tensorflow/tpu's exponential staircase. A new
schedule is a class here and its line in the table at the bottom.
"""

import dataclasses
import math
from typing import Callable

import keras
from keras import ops

from pipeline import parts

SCHEDULES = parts.Table('schedule', 'lr_schedule')


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


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule(parts.Part):
  """A schedule by its config name: make(settings, peak, warmup_steps,
  total_steps, steps_per_epoch) -> the keras LearningRateSchedule."""
  name: str
  description: str
  make: Callable[..., keras.optimizers.schedules.LearningRateSchedule]
  keys: dict = dataclasses.field(default_factory=dict)


def _decay_steps(warmup_steps, total_steps):
  return max(total_steps - warmup_steps, 1)


for _schedule in (
    Schedule('cosine', 'cosine decay to 0 at the end',
             lambda settings, peak, warmup, total, per_epoch:
             WarmupCosineDecay(peak, warmup, _decay_steps(warmup, total))),
    Schedule('exponential', "tensorflow/tpu's staircase: x lr_decay_rate "
             'every lr_decay_epochs',
             lambda settings, peak, warmup, total, per_epoch:
             WarmupExponentialDecay(
                 peak, warmup, max(settings.lr_decay_epochs * per_epoch, 1.0),
                 settings.lr_decay_rate),
             keys={'lr_decay_rate': parts.Key('exponential: the rate kept '
                                              'at each stair'),
                   'lr_decay_epochs': parts.Key('exponential: epochs between '
                                                'stairs')}),
    Schedule('linear', 'a straight line to 0 at the end',
             lambda settings, peak, warmup, total, per_epoch: WarmupLinearDecay(
                 peak, warmup, _decay_steps(warmup, total))),
):
  SCHEDULES.register(_schedule)


def learning_rate_schedule(settings, warmup_epochs, peak, total_steps,
                           steps_per_epoch):
  """The lr_schedule `settings` (SCHEDULES.settings) name, after a linear
  warmup to `peak` over `warmup_epochs`."""
  warmup_steps = min(int(warmup_epochs * steps_per_epoch),
                     max(total_steps - 1, 0))
  return SCHEDULES[settings.lr_schedule].make(
      settings, peak, warmup_steps, total_steps, steps_per_epoch)
