"""The optimizers config.optimizer names, each one object in OPTIMIZERS
(a new one is its line in the table), on the schedule schedules.py makes.
Weight decay skips batch-norm parameters and biases. The training step
sums gradients across replicas itself, so its optimizer is told not to
sum them again (take_summed_gradients).
"""

import dataclasses
from typing import Callable

import keras

from pipeline import parts
from pipeline.recipe import schedules
from pipeline.rules.speed import precision

OPTIMIZERS = parts.Table('optimizer', 'optimizer')


@dataclasses.dataclass(frozen=True, eq=False)
class Optimizer(parts.Part):
  """An optimizer by its config name: make(schedule, weight_decay, **clip),
  `clip` Keras' global_clipnorm where grad_clip_norm asks for it."""
  name: str
  description: str
  make: Callable[..., keras.optimizers.Optimizer]
  keys: dict = dataclasses.field(default_factory=dict)


for _optimizer in (
    Optimizer('adamw', 'AdamW, decoupled weight decay',
              lambda schedule, weight_decay, **clip: keras.optimizers.AdamW(
                  schedule, weight_decay=weight_decay, **clip)),
    Optimizer('sgd', 'SGD with Nesterov momentum 0.9',
              lambda schedule, weight_decay, **clip: keras.optimizers.SGD(
                  schedule, momentum=0.9, nesterov=True,
                  weight_decay=weight_decay, **clip)),
    # tensorflow/tpu's RMSProp: decay 0.9, momentum 0.9, epsilon 1e-3,
    # which like Keras' sits inside the square root.
    Optimizer('rmsprop', "tensorflow/tpu's RMSProp (decay and momentum 0.9, "
              'epsilon 1e-3)',
              lambda schedule, weight_decay, **clip: keras.optimizers.RMSprop(
                  schedule, rho=0.9, momentum=0.9, epsilon=1e-3,
                  weight_decay=weight_decay, **clip)),
):
  OPTIMIZERS.register(_optimizer)


def make_optimizer(config, peak, total_steps, steps_per_epoch):
  """The config's optimizer on its learning-rate schedule, peaking at
  `peak`.

  `total_steps` and `steps_per_epoch` count updates (an update with
  gradient accumulation takes several micro-batches).
  """
  # Keras clips in apply, after a LossScaleOptimizer has unscaled.
  clip = ({'global_clipnorm': config.grad_clip_norm}
          if config.grad_clip_norm else {})
  schedule = schedules.learning_rate_schedule(
      schedules.SCHEDULES.settings(config), config.warmup_epochs, peak,
      total_steps, steps_per_epoch)
  optimizer = OPTIMIZERS.of(config).make(schedule, config.weight_decay,
                                         **clip)
  # Decay only weight matrices: decaying norms and biases hurts small models.
  optimizer.exclude_from_weight_decay(var_names=['bn', 'bias', 'gamma',
                                                 'beta'])
  return optimizer


def optimizer_of_run(plan):
  """The run's optimizer and schedule, wrapped in a LossScaleOptimizer where
  its policy computes in float16 (rules/speed/precision.py)."""
  return precision.wrap_optimizer(
      make_optimizer(plan.recipe, plan.peak_learning_rate, plan.total_steps,
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
