"""The jitted programs of the JAX trainer: a whole execution of training
steps in one `lax.fori_loop`, and the evaluation step.

The model is replicated on every device and each batch split over them;
XLA (GSPMD) inserts the gradient all-reduce. Batch-norm statistics are
computed over the whole global batch (as synchronised batch norm), where
the TensorFlow path normalises per replica and averages the moving
statistics after each execution.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np

from pipeline.recipe import models
from pipeline.recipe import objective


def on_host(tree):
  """Numpy copies of replicated arrays: this host's copy of each (on
  several hosts no process can fetch a whole global array)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


class _Phase:
  """What a train program trains. The state always holds the model's
  variables as built (all trainable); with the backbone `frozen` (the first
  phase of fine-tuning) its weights are passed to Keras among the
  non-trainable ones, so they get no gradient and its batch norm runs in
  inference mode, as on TensorFlow (its trainer sets `trainable` alike)."""

  def __init__(self, model, frozen):
    self.model, self.frozen = model, frozen
    self.all_trainable = model.trainable_variables
    built = self.all_trainable + model.non_trainable_variables
    self.place = {id(v): i for i, v in enumerate(built)}
    with self.applied():
      self.trainable = model.trainable_variables
      self.non_trainable = model.non_trainable_variables

  @contextlib.contextmanager
  def applied(self):
    """The model as this phase calls it (read when a program is traced)."""
    backbone = models.backbone(self.model) if self.frozen else None
    if backbone:
      backbone.trainable = False
    try:
      yield
    finally:
      if backbone:
        backbone.trainable = True

  def split(self, state):
    """The state's values as this phase's (trainable, non_trainable)."""
    values = state['trainable'] + state['non_trainable']
    return ([values[self.place[id(v)]] for v in self.trainable],
            [values[self.place[id(v)]] for v in self.non_trainable])

  def merge(self, state, trainable, non_trainable):
    """The state's (trainable, non_trainable) with this phase's values."""
    values = list(state['trainable'] + state['non_trainable'])
    for variable, value in zip(self.trainable + self.non_trainable,
                               trainable + non_trainable):
      values[self.place[id(variable)]] = value
    return values[:len(self.all_trainable)], values[len(self.all_trainable):]

  def apply(self, optimizer, optimizer_state, trainable, grads):
    """optimizer.stateless_apply for this phase's variables only: a frozen
    backbone's weights and optimizer slots are left as they are (Keras'
    stateless_apply takes gradients for every variable it was built with,
    and a zero gradient would still move a weight under weight decay).

    Under a LossScaleOptimizer (float16; never with a frozen backbone, which
    build refuses) Keras' own stateless_apply does every step: it unscales
    the gradients, skips a step with a non-finite one and halves the scale,
    and doubles it after `dynamic_growth_steps` finite steps.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      return optimizer.stateless_apply(optimizer_state, grads, trainable)
    mapping = (list(zip(self.all_trainable, trainable)) +
               list(zip(optimizer.variables, optimizer_state)))
    with keras.StatelessScope(state_mapping=mapping) as scope:
      optimizer.apply(grads, self.trainable)
    return ([scope.get_current_value(v) for v in self.all_trainable],
            [scope.get_current_value(v) for v in optimizer.variables])


def optimizer_places(optimizer):
  """Where the optimizer's step count ('iterations': applied updates) and,
  under a LossScaleOptimizer, its 'dynamic_scale' sit in the state's
  optimizer values."""
  index = {id(v): i for i, v in enumerate(optimizer.variables)}
  place = {'iterations': index[id(optimizer.iterations)]}
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    place['dynamic_scale'] = index[id(optimizer.dynamic_scale)]
  return place


def train_program(model, optimizer, config, num_classes, strategy, ema,
                  frozen=False):
  """The jitted program: state, images [slots, batch, ...], labels, steps
  -> (state, outputs). One fori_loop on the device over the first `steps`
  slots; gradient accumulation a scan over micro-batches inside a step.
  `frozen`: the backbone stays as it is (_Phase)."""
  one_step = _step_function(model, optimizer, config, num_classes, ema,
                            frozen, config.gradient_accumulation_steps)

  @functools.partial(jax.jit, donate_argnums=0,
                     out_shardings=strategy.replicated)
  def train(state, images, labels, num_steps):
    # A loop on the device over the first num_steps of the stacked batches.
    def body(index, carry):
      state, losses, correct = carry
      state, (loss, hits) = one_step(state, (images[index], labels[index]))
      return state, losses.at[index].set(loss), correct + hits

    losses = jnp.zeros(images.shape[0])
    state, losses, correct = jax.lax.fori_loop(
        0, num_steps, body, (state, losses, 0.0))
    return state, {'loss': jnp.sum(losses) / num_steps,
                   'accuracy': correct / (num_steps * labels.shape[1]),
                   'step_losses': losses}

  return train


def cost_program(model, optimizer, config, num_classes, strategy, ema):
  """One training step of one micro-batch, loop-free, jitted: state,
  images [micro_batch, ...], labels -> state. What step_cost compiles: XLA
  counts a loop's body once, or every iteration where it unrolls a short
  loop, so the train program's figures would depend on that choice."""
  one_step = _step_function(model, optimizer, config, num_classes, ema,
                            False, 1)
  return jax.jit(lambda state, images, labels: one_step(
      state, (images, labels))[0], out_shardings=strategy.replicated)


def _step_function(model, optimizer, config, num_classes, ema, frozen,
                   accumulation):
  """One training step as a traceable function: (state, (images, labels))
  -> (state, (loss, correct))."""
  loss_fn = objective.loss_function(config.label_smoothing)
  l2 = config.l2_weight_decay
  phase = _Phase(model, frozen)
  decayed = [objective.is_decayed(v) for v in phase.trainable]
  place = optimizer_places(optimizer)

  def loss_of(trainable, non_trainable, images, targets, scale):
    with phase.applied():
      logits, non_trainable = model.stateless_call(
          trainable, non_trainable, images, training=True)
    loss = jnp.mean(loss_fn(targets, logits))
    if l2:
      loss += l2 * objective.l2_penalty(
          [w for w, on in zip(trainable, decayed) if on])
    # Differentiated: the loss times the loss scale (1 without float16).
    return loss * scale, (non_trainable, objective.correct(logits, targets),
                          loss)

  gradient = jax.value_and_grad(loss_of, has_aux=True)

  def one_step(state, batch):
    images, labels = batch
    targets = objective.targets(labels, num_classes)
    micro = lambda t: t.reshape(accumulation, -1, *t.shape[1:])

    trained, non_trainable = phase.split(state)
    scale = (state['optimizer'][place['dynamic_scale']]
             if 'dynamic_scale' in place else 1.0)

    def add(carry, part):
      non_trainable, grads, loss, correct = carry
      (_, (non_trainable, part_correct, part_loss)), part_grads = gradient(
          trained, non_trainable, *part, scale)
      grads = jax.tree.map(lambda a, b: a + b / accumulation, grads,
                           part_grads)
      return (non_trainable, grads, loss + part_loss / accumulation,
              correct + part_correct), None

    zeros = jax.tree.map(jnp.zeros_like, trained)
    (non_trainable, grads, loss, correct), _ = jax.lax.scan(
        add, (non_trainable, zeros, 0.0, 0.0),
        (micro(images), micro(targets)))
    trainable, non_trainable = phase.merge(state, trained, non_trainable)
    trainable, optimizer_state = phase.apply(
        optimizer, state['optimizer'], trainable, grads)
    updates = optimizer_state[place['iterations']]
    applied = updates > state['optimizer'][place['iterations']]
    state = dict(state, trainable=trainable, non_trainable=non_trainable,
                 optimizer=optimizer_state, step=state['step'] + 1)
    if ema:  # A step the loss scale skipped is no update of the average.
      state['ema'] = [jnp.where(applied, new, old) for new, old in zip(
          ema.update(state, updates), state['ema'])]
    return state, (loss, correct)

  return one_step


def eval_program(model, num_classes, strategy):
  """The jitted eval step: objective.eval_sums of one batch."""

  @functools.partial(jax.jit, out_shardings=strategy.replicated)
  def evaluate(trainable, non_trainable, images, labels, weights):
    logits, _ = model.stateless_call(trainable, non_trainable, images,
                                     training=False)
    return objective.eval_sums(logits, labels, weights, num_classes)

  return evaluate
