"""The jitted programs of the JAX trainer: one training step, the forward
and backward pass step_cost counts, and the evaluation step.

The model is replicated on every device and each batch split over them;
XLA (GSPMD) inserts the gradient all-reduce. Batch-norm statistics are
computed over the whole global batch (as synchronised batch norm), where
the TensorFlow path normalises per replica and averages the moving
statistics after each execution.

No program loops over steps, and nothing in one waits on the host. The
trainer dispatches one step per batch, as Keras 3's own JAX trainer does:
dispatch returns at once, so the host stages the next execution's input
while the queued steps run. A loop over an execution's steps inside one
program cost more everywhere it was measured: XLA on this CPU ran B0's
step 2.5x slower inside any `while` (16 against 41 images/s, 32 px),
unrolled it compiled 4.5x longer at 8 steps (BUILD_NOTES.md), and on a GPU
a `while` whose trip count is a runtime value copies its predicate to the
host after every iteration and waits for it, on the thread that launched
the program (xla/backends/gpu/runtime/while_thunk.cc), as does every
`conditional`. So loss scaling selects instead of branching, and the
schedules are `where`, not `cond` (recipe/schedules.py). Imports no
TensorFlow.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np

from pipeline.backends.jax.train_state import TrainState
from pipeline.recipe import models
from pipeline.recipe import objective as objective_lib


def on_host(tree):
  """Numpy copies of replicated arrays: this host's copy of each (on
  several hosts no process can fetch a whole global array)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def initial_state(model, optimizer, strategy, step, ema_values=None):
  """The run's state as JAX arrays replicated on every device: the model's
  and the optimizer's variables, the `step` and the moving averages'
  `ema_values` (None: no average), flattened into one vector (ema.py)."""
  state = TrainState(
      trainable=[v.value for v in model.trainable_variables],
      non_trainable=[v.value for v in model.non_trainable_variables],
      optimizer=[v.value for v in optimizer.variables],
      step=step,
      ema=None if ema_values is None else np.concatenate(
          [np.ravel(np.asarray(v)) for v in ema_values]))
  # Copies: the program donates the state's buffers, and an average that
  # starts as its weight (or a restored variable) may share one with it.
  return jax.device_put(jax.tree.map(np.array, state), strategy.replicated)


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
    values = state.weights()
    return ([values[self.place[id(v)]] for v in self.trainable],
            [values[self.place[id(v)]] for v in self.non_trainable])

  def merge(self, state, trainable, non_trainable):
    """The state's (trainable, non_trainable) with this phase's values."""
    values = state.weights()
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
    build refuses) loss_scaled_apply does Keras' rule without its branches.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      return loss_scaled_apply(optimizer, optimizer_state, trainable, grads)
    mapping = (list(zip(self.all_trainable, trainable)) +
               list(zip(optimizer.variables, optimizer_state)))
    with keras.StatelessScope(state_mapping=mapping) as scope:
      optimizer.apply(grads, self.trainable)
    return ([scope.get_current_value(v) for v in self.all_trainable],
            [scope.get_current_value(v) for v in optimizer.variables])


def loss_scaled_apply(optimizer, optimizer_state, trainable, grads):
  """Keras' LossScaleOptimizer.stateless_apply, with selects for its two
  `cond`s (each a host round trip per step on a GPU): the gradients are
  unscaled and the inner optimizer applied; a step with a non-finite
  gradient keeps the weights and the inner optimizer's state (its update
  count too) and halves the scale; `dynamic_growth_steps` finite steps in
  a row double it. The result equals Keras' (tests/test_trainer_jax.py)."""
  inner = optimizer.inner_optimizer
  own = len(optimizer.variables) - len(inner.variables)  # Theirs come last.
  place = [id(v) for v in optimizer.variables]
  counter, scale = (optimizer_state[place.index(id(v))]
                    for v in (optimizer.step_counter, optimizer.dynamic_scale))
  finite = optimizer.check_finite(grads)
  applied, inner_state = inner.stateless_apply(
      optimizer_state[own:], [g / scale for g in grads], trainable)
  keep = lambda new, old: [jnp.where(finite, n, o) for n, o in zip(new, old)]
  grows = counter == optimizer.dynamic_growth_steps - 1
  values = {id(optimizer.step_counter): jnp.where(
                finite & ~grows, counter + 1, jnp.zeros_like(counter)),
            id(optimizer.dynamic_scale): jnp.where(
                finite, jnp.where(grows, scale * 2.0, scale), scale * 0.5)}
  # Its own other variables (an iteration count, a rate) it never changes.
  own_state = [values.get(id(v), value) for v, value in
               zip(optimizer.variables[:own], optimizer_state[:own])]
  return (keep(applied, trainable),
          own_state + keep(inner_state, optimizer_state[own:]))


def optimizer_places(optimizer):
  """Where the optimizer's step count ('iterations': applied updates) and,
  under a LossScaleOptimizer, its 'dynamic_scale' sit in the state's
  optimizer values."""
  index = {id(v): i for i, v in enumerate(optimizer.variables)}
  place = {'iterations': index[id(optimizer.iterations)]}
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    place['dynamic_scale'] = index[id(optimizer.dynamic_scale)]
  return place


def train_step(model, optimizer, objective, strategy, ema, frozen=False,
               accumulation=1):
  """The jitted step: (state, images, labels) -> (state, (loss, correct,
  gradient norm)),
  the state's buffers donated. `objective`: what it minimises
  (objective_lib.Objective); `frozen`: the backbone stays as it is
  (_Phase); `accumulation`: micro-batches a step."""
  one_step = step_function(model, optimizer, objective, ema, frozen,
                           accumulation)
  return jax.jit(lambda state, images, labels: one_step(state, (images,
                                                                labels)),
                 donate_argnums=0, out_shardings=strategy.replicated)


def gradient_program(model, optimizer, objective, strategy):
  """The forward and backward pass of one micro-batch, loop-free, jitted:
  state, images [micro_batch, ...], labels -> (loss, gradients). What
  step_cost counts, as TensorFlow's counts its own gradient function:
  the two backends' figures then describe the same work."""
  del optimizer  # The same signature as the train program's.
  gradient = _gradient_function(model, objective, _Phase(model, False))

  def loss_and_gradients(state, images, labels):
    trainable, non_trainable = state.trainable, state.non_trainable
    (_, (_, _, loss)), grads = gradient(
        trainable, non_trainable, images,
        objective.targets(labels), 1.0)
    return loss, grads

  return jax.jit(loss_and_gradients, out_shardings=strategy.replicated)


def _gradient_function(model, objective, phase):
  """value_and_grad of the scaled loss: (trainable, non_trainable, images,
  targets, scale) -> ((loss * scale, (non_trainable, correct, loss)),
  gradients)."""
  loss_fn = objective.per_example_loss()

  def loss_of(trainable, non_trainable, images, targets, scale):
    with phase.applied():
      logits, non_trainable = model.stateless_call(
          trainable, non_trainable, images, training=True)
    loss = jnp.mean(loss_fn(targets, logits))
    if objective.l2_weight_decay:
      loss += objective.penalty(phase.trainable, trainable)
    # Differentiated: the loss times the loss scale (1 without float16).
    correct = objective_lib.correct(logits, targets)
    return loss * scale, (non_trainable, correct, loss)

  return jax.value_and_grad(loss_of, has_aux=True)


def step_function(model, optimizer, objective, ema, frozen, accumulation):
  """One training step as a traceable function: (state, (images, labels))
  -> (state, (loss, correct, gradient norm)): the norm is the whole
  batch's gradient's, before the loss scale (unscaled) and any clipping."""
  phase = _Phase(model, frozen)
  gradient = _gradient_function(model, objective, phase)
  place = optimizer_places(optimizer)

  def one_step(state, batch):
    images, labels = batch
    targets = objective.targets(labels)
    micro = lambda t: t.reshape(accumulation, -1, *t.shape[1:])

    trained, non_trainable = phase.split(state)
    scale = (state.optimizer[place['dynamic_scale']]
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
    carry = (non_trainable, zeros, 0.0, 0.0)
    if accumulation == 1:  # No loop: XLA on a CPU runs one 2.5x slower.
      carry, _ = add(carry, (images, targets))
    else:
      carry, _ = jax.lax.scan(add, carry, (micro(images), micro(targets)))
    non_trainable, grads, loss, correct = carry
    grad_norm = global_norm(grads) / scale
    trainable, non_trainable = phase.merge(state, trained, non_trainable)
    # Named scopes: the probe's profile (step_profile.py) finds the
    # optimizer's and the average's kernels by them.
    with jax.named_scope('optimizer'):
      trainable, optimizer_state = phase.apply(
          optimizer, state.optimizer, trainable, grads)
    updates = optimizer_state[place['iterations']]
    applied = updates > state.optimizer[place['iterations']]
    state = state.replace(trainable=trainable, non_trainable=non_trainable,
                          optimizer=optimizer_state, step=state.step + 1)
    if ema:  # A step the loss scale skipped is no update of the average.
      with jax.named_scope('moving_average'):
        state = state.replace(ema=jnp.where(
            applied, ema.update(state, updates), state.ema))
    return state, (loss, correct, grad_norm)

  return one_step


def global_norm(tree):
  """The global L2 norm of a pytree's arrays, summed in float32."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(leaf.astype(jnp.float32)))
                      for leaf in jax.tree.leaves(tree)))


def eval_program(model, num_classes, strategy):
  """The jitted eval step: objective_lib.eval_sums of one batch."""

  @functools.partial(jax.jit, out_shardings=strategy.replicated)
  def evaluate(trainable, non_trainable, images, labels, weights):
    logits, _ = model.stateless_call(trainable, non_trainable, images,
                                     training=False)
    return objective_lib.eval_sums(logits, labels, weights, num_classes)

  return evaluate
