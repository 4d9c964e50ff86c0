"""Model, optimizer and compiled multi-step program on Keras' JAX backend.

The same `Trainer` interface as pipeline/trainer.py (train, evaluate, the
exported weights, checkpoint files), so train_and_evaluate, its actions and
launch.evaluate run unchanged. Keras 3.15's JAX trainer runs
`steps_per_execution` as a Python loop around a compiled step (its
on-device loop came later, keras#23527); here one jitted program runs all
of an execution's steps in a `lax.fori_loop` over batches stacked on the
host, with the state as JAX arrays (Keras' stateless_call and
stateless_apply) written back into the Keras variables only to save,
evaluate or export.

The model is replicated on every device and each batch split over them;
XLA (GSPMD) inserts the gradient all-reduce. Batch-norm statistics are
computed over the whole global batch (as synchronised batch norm), where
the TensorFlow path normalises per replica and averages the moving
statistics after each execution.
"""

import contextlib
import dataclasses
import functools
import hashlib
import time
from typing import Optional

import jax
import jax.numpy as jnp
import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from pipeline import checkpoint_keras
from pipeline import decode
from pipeline import models
from pipeline import optimizers
from pipeline import precision
from pipeline import trainer as trainer_lib
from pipeline.errors import UserError


@dataclasses.dataclass
class Trainer:
  """The JAX state of a run and its compiled train and eval programs."""
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  strategy: object  # devices_jax.DataParallel
  state: dict  # trainable, non_trainable, optimizer, ema, step: JAX arrays.
  train_program: object
  eval_program: object
  num_classes: int
  label_offset: int
  out_of_memory: str
  ema: Optional['MovingAverage'] = None
  step_variables: checkpoint_keras.Variables = None
  slots: int = 1  # Steps one program call can run: steps_per_execution.
  frozen_steps: int = 0  # Fine-tuning: the first steps train the head alone,
  frozen_program: object = None  # in this program.

  # --- what train_and_evaluate, the actions and the evaluator read ---

  @property
  def step(self):
    """The step counter, as the TensorFlow trainer's (`.numpy()`)."""
    return _Scalar(self.state['step'])

  @property
  def skipped_steps(self):
    return 0  # No loss scaling on JAX: every step is applied.

  @property
  def loss_scale(self):
    return None

  def learning_rate(self):
    iterations = self.optimizer.iterations
    index = [id(v) for v in self.optimizer.variables].index(id(iterations))
    iterations.assign(_on_host(self.state['optimizer'][index]))
    return float(self.optimizer.learning_rate)

  def train(self, iterator, num_steps):
    """Runs `num_steps` steps in one compiled program; the same outputs as
    the TensorFlow trainer's (loss, accuracy, input_wait_s,
    skipped_records, step_losses).

    Batches are stacked to steps_per_execution slots whatever `num_steps`
    is (unused ones zeros, never run), so a short last execution reuses
    the one compiled program instead of compiling another (a minute for
    B0 on a CPU). Before `frozen_steps` the frozen-backbone program runs;
    the loop never lets an execution cross that step.
    """
    program = self.train_program
    if self.frozen_steps and int(self.step.numpy()) < self.frozen_steps:
      program = self.frozen_program
    start = time.perf_counter()
    with self._errors_in_one_line():  # The input checks the labels.
      batches = [next(iterator) for _ in range(num_steps)]
    wait_s = time.perf_counter() - start
    stacked = [np.stack(parts) for parts in zip(*batches)]
    images, labels = [
        np.concatenate([a, np.zeros((self.slots - num_steps, *a.shape[1:]),
                                    a.dtype)]) for a in stacked[:2]]
    images, labels = self.strategy.to_devices([images, labels], stacked=True)
    with self._errors_in_one_line():
      self.state, outputs = program(self.state, images, labels,
                                    np.int32(num_steps))
      outputs = _on_host(outputs)
    return {'loss': float(outputs['loss']),
            'accuracy': float(outputs['accuracy']),
            'input_wait_s': wait_s,
            'skipped_records': int(stacked[2].sum()) if len(stacked) > 2 else 0,
            'step_losses': np.asarray(outputs['step_losses'][:num_steps])}

  def evaluate(self, dataset, num_steps):
    """As the TensorFlow trainer's: the averaged weights' figures with a
    moving average (and the model's own as *_raw)."""
    raw = self._evaluate(dataset, num_steps, self.state['trainable'],
                         self.state['non_trainable'])
    if not self.ema:
      return raw
    trainable, non_trainable = self.ema.as_model_state(self.state)
    result = self._evaluate(dataset, num_steps, trainable, non_trainable)
    return dict(result, **{f'{key}_raw': raw[key] for key in
                           ('loss', 'accuracy', 'top5_accuracy')})

  def _evaluate(self, dataset, num_steps, trainable, non_trainable):
    totals = np.zeros(4)
    confusion = np.zeros((self.num_classes, self.num_classes))
    iterator = iter(dataset)
    with self._errors_in_one_line():
      for _ in range(num_steps):
        batch = self.strategy.to_devices(next(iterator))
        sums, matrix = _on_host(
            self.eval_program(trainable, non_trainable, *batch))
        totals += sums
        confusion += matrix
    loss, correct, correct_top_k, examples = totals
    return {'loss': loss / examples, 'accuracy': correct / examples,
            'top5_accuracy': correct_top_k / examples,
            'examples': float(examples), 'confusion': confusion}

  def write_back(self):
    """Writes the JAX state into the Keras variables (model, optimizer,
    step, averages): before a save, an export or a digest."""
    for variables, values in (
        (self.model.trainable_variables, self.state['trainable']),
        (self.model.non_trainable_variables, self.state['non_trainable']),
        (self.optimizer.variables, self.state['optimizer']),
        (self.step_variables.values, [self.state['step']]),
        (self.ema.variables.values if self.ema else [],
         self.state.get('ema', []))):
      for variable, value in zip(variables, _on_host(list(values))):
        variable.assign(value)

  def read_back(self):
    """The Keras variables (just restored) become the JAX state."""
    self.state = _state_of(self.model, self.optimizer, self.step_variables,
                           self.ema, self.strategy)

  def exported_weights(self):
    """A context in which the model holds what is exported."""
    self.write_back()
    if not self.ema:
      return contextlib.nullcontext()
    return self.ema.applied_to_model(self.model, self.state)

  def weights_sha256(self):
    self.write_back()
    digest = hashlib.sha256()
    for weight in self.model.weights:
      digest.update(np.ascontiguousarray(np.asarray(weight.value)).tobytes())
    return digest.hexdigest()

  def checkpoint_files(self, directory, max_to_keep, io_device=None,
                       keras_format=True):
    """The local layer of this run's checkpoints: Keras' files, or (not
    `keras_format`: a run trained on TensorFlow, read here) TensorFlow's.
    `io_device` is a TPU Node's, which JAX never drives."""
    del io_device
    if not keras_format:
      return TensorFlowRunFiles(self, directory, max_to_keep)
    return _StateFiles(self, directory, max_to_keep)

  @contextlib.contextmanager
  def _errors_in_one_line(self):
    try:
      yield
    except jax.errors.JaxRuntimeError as e:
      if 'RESOURCE_EXHAUSTED' in str(e):
        raise UserError(self.out_of_memory) from None
      raise
    except tf.errors.InvalidArgumentError as e:  # The input's label check.
      message = decode.label_error(e, self.num_classes, self.label_offset)
      if message:
        raise UserError(message) from None
      raise


def _on_host(tree):
  """Numpy copies of replicated arrays: this host's copy of each (on
  several hosts no process can fetch a whole global array)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


class _Scalar:
  """A JAX scalar with the `.numpy()` the training loop reads."""

  def __init__(self, value):
    self.value = value

  def numpy(self):
    return _on_host(self.value)


class _StateFiles(checkpoint_keras.KerasFiles):
  """Keras files of a JAX trainer: its state is written back before each
  save and read back after each restore."""

  def __init__(self, trainer, directory, max_to_keep):
    parts = dict(model=trainer.model, optimizer=trainer.optimizer,
                 step=trainer.step_variables)
    if trainer.ema:
      parts['ema'] = trainer.ema.variables
    super().__init__(parts, directory, max_to_keep)
    self.trainer = trainer

  def save(self, step):
    self.trainer.write_back()
    return super().save(step)

  def restore(self, path, optional=()):
    missing = super().restore(path, optional)
    self.trainer.read_back()
    return missing


class TensorFlowRunFiles:
  """A TensorFlow run's checkpoints read by the JAX trainer (launch.evaluate
  on a JAX machine): the model, the step and the moving average.

  A TensorFlow checkpoint holds its object graph: every saved object's
  children by attribute name. Walking it from `model`, `step` and `ema` and
  following the same attribute names from the same objects here
  (`model/_operations/2/_operations/101/moving_mean`: layers by their place
  in the Functional graph, which Keras builds alike on every backend;
  `ema/values/7`, whose JAX twin is also `values`) finds each variable,
  whichever path its key was saved under (often the optimizer's). The
  optimizer is not read: evaluating needs none. Never written: the run
  resumes on TensorFlow.
  """

  def __init__(self, trainer, directory, max_to_keep):
    del max_to_keep
    self.trainer, self.directory = trainer, directory
    self.roots = dict(model=trainer.model,
                      step=trainer.step_variables.values[0])
    if trainer.ema:
      self.roots['ema'] = trainer.ema.variables

  def save(self, step):
    raise UserError(f'{self.directory} holds a run trained on TensorFlow; it '
                    'resumes with --backend=tensorflow')

  def latest(self):
    found = self.paths(self.directory)
    return found[-1] if found else None

  @staticmethod
  def paths(directory):
    state = tf.train.get_checkpoint_state(directory)
    return list(state.all_model_checkpoint_paths if state else [])

  def restore(self, path, optional=()):
    """Restores `path`; returns the `optional` parts it lacks. ValueError
    where the file does not hold this model."""
    reader = tf.train.load_checkpoint(path)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
    found = {}  # Node id: the object here at the same attribute path.
    queue = []
    for child in graph.nodes[0].children:
      if child.local_name in self.roots:
        found[child.node_id] = self.roots[child.local_name]
        queue.append(child.node_id)
    missing = [n for n in optional if n in self.roots and not any(
        c.local_name == n for c in graph.nodes[0].children)]
    assigned = set()
    while queue:
      node = queue.pop(0)
      here = found[node]
      for attribute in graph.nodes[node].attributes:
        if attribute.name == 'VARIABLE_VALUE':
          here.assign(reader.get_tensor(attribute.checkpoint_key))
          assigned.add(id(here))
      for child in graph.nodes[node].children:
        if child.node_id in found:
          continue
        name = child.local_name
        try:
          found[child.node_id] = (
              here[int(name)] if isinstance(here, (list, tuple))
              else getattr(here, name))
        except (AttributeError, IndexError, ValueError, TypeError):
          continue  # TensorFlow-only bookkeeping, not a variable of ours.
        queue.append(child.node_id)
    unread = [v.path for v in self.trainer.model.weights
              if id(v) not in assigned]
    if unread:
      raise ValueError(f'{path} does not hold this model: {len(unread)} '
                       f'weights not found, e.g. {unread[0]}')
    self.trainer.read_back()
    return missing


class MovingAverage:
  """pipeline/ema.py's average (same warm-up, same variables: every float32
  weight, batch-norm statistics included) as a function of the JAX state."""

  def __init__(self, model, decay):
    self.decay = decay
    weights = model.weights
    self.sources = [i for i, v in enumerate(weights) if v.dtype == 'float32']
    self.variables = checkpoint_keras.Variables(
        'ema', like=[weights[i] for i in self.sources])
    for average, i in zip(self.variables.values, self.sources):
      average.assign(weights[i].value)  # The average starts at the weights.
    # Where each model weight sits in the state: (trainable?, index).
    trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
    non_trainable = {id(v): i
                     for i, v in enumerate(model.non_trainable_variables)}
    self.places = [('trainable', trainable[id(weights[i])])
                   if id(weights[i]) in trainable else
                   ('non_trainable', non_trainable[id(weights[i])])
                   for i in self.sources]
    self.trainer = None

  def of(self, state):
    """The averaged variables' current values in `state`."""
    return [state[kind][index] for kind, index in self.places]

  def update(self, state, num_updates):
    """The averages after one applied update (the `num_updates`th)."""
    n = num_updates.astype(jnp.float32)
    decay = jnp.minimum(self.decay, (1.0 + n) / (10.0 + n))
    return [average - (1.0 - decay) * (average - value)
            for average, value in zip(state['ema'], self.of(state))]

  def as_model_state(self, state):
    """(trainable, non_trainable) with the averages in place of the weights."""
    trainable = list(state['trainable'])
    non_trainable = list(state['non_trainable'])
    lists = {'trainable': trainable, 'non_trainable': non_trainable}
    for (kind, index), average in zip(self.places, state['ema']):
      lists[kind][index] = average
    return trainable, non_trainable

  def reset(self):
    """Starts the average at the model's current weights."""
    if self.trainer:  # Copies: the train program donates the state.
      self.trainer.state['ema'] = [jnp.copy(value) for value in
                                   self.of(self.trainer.state)]

  @contextlib.contextmanager
  def applied_to_model(self, model, state):
    """The model's variables hold the averages inside, the weights after."""
    variables = model.trainable_variables + model.non_trainable_variables
    trainable, non_trainable = self.as_model_state(state)
    for variable, value in zip(variables, _on_host(trainable + non_trainable)):
      variable.assign(value)
    try:
      yield
    finally:
      for variable, value in zip(variables, _on_host(
          state['trainable'] + state['non_trainable'])):
        variable.assign(value)


def _state_of(model, optimizer, step_variables, ema, strategy):
  """The run's state as JAX arrays, replicated on every device."""
  state = {
      'trainable': [v.value for v in model.trainable_variables],
      'non_trainable': [v.value for v in model.non_trainable_variables],
      'optimizer': [v.value for v in optimizer.variables],
      'step': step_variables.values[0].value,
  }
  if ema:
    state['ema'] = [v.value for v in ema.variables.values]
  # Copies: the program donates the state's buffers, and an average that
  # starts as its weight (or a restored variable) may share one with it.
  return jax.device_put(jax.tree.map(np.array, state), strategy.replicated)


def build(config, plan):
  """Sets the policy and seed, builds the model and the two programs."""
  hardware = plan.hardware
  num_classes = plan.source.num_classes
  precision.apply(plan.precision, hardware.device_kind)
  keras.utils.set_random_seed(config.seed)
  model = models.build_model(
      config.model, num_classes, config.image_size, config.dropout_rate,
      config.batch_norm_momentum, config.drop_connect_rate)
  optimizer = optimizers.make_optimizer(config, plan.peak_learning_rate,
                                        plan.total_steps, plan.steps_per_epoch)
  optimizer.build(model.trainable_variables)
  step_variables = checkpoint_keras.Variables('step', shapes=[()],
                                              dtype='int32')
  ema = MovingAverage(model, config.ema_decay) if config.ema_decay else None
  strategy = hardware.strategy
  trainer = Trainer(
      model, optimizer, strategy,
      _state_of(model, optimizer, step_variables, ema, strategy),
      train_program(model, optimizer, config, num_classes, strategy, ema),
      eval_program(model, num_classes, strategy),
      num_classes, config.label_offset,
      trainer_lib.out_of_memory_message(config, plan), ema=ema,
      step_variables=step_variables, slots=plan.steps_per_execution,
      frozen_steps=plan.frozen_steps,
      frozen_program=(train_program(model, optimizer, config, num_classes,
                                    strategy, ema, frozen=True)
                      if plan.frozen_steps else None))
  if ema:
    ema.trainer = trainer
  return trainer


class _Phase:
  """What a train program trains. The state always holds the model's
  variables as built (all trainable); with the backbone `frozen` (the first
  phase of fine-tuning) its weights are passed to Keras among the
  non-trainable ones, so they get no gradient and its batch norm runs in
  inference mode, as on TensorFlow (trainer.py sets `trainable` alike)."""

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
    and a zero gradient would still move a weight under weight decay)."""
    mapping = (list(zip(self.all_trainable, trainable)) +
               list(zip(optimizer.variables, optimizer_state)))
    with keras.StatelessScope(state_mapping=mapping) as scope:
      optimizer.apply(grads, self.trainable)
    return ([scope.get_current_value(v) for v in self.all_trainable],
            [scope.get_current_value(v) for v in optimizer.variables])


def train_program(model, optimizer, config, num_classes, strategy, ema,
                  frozen=False):
  """The jitted program: state, images [slots, batch, ...], labels, steps
  -> (state, outputs). One fori_loop on the device over the first `steps`
  slots; gradient accumulation a scan over micro-batches inside a step.
  `frozen`: the backbone stays as it is (_Phase)."""
  loss_fn = keras.losses.CategoricalCrossentropy(
      from_logits=True, label_smoothing=config.label_smoothing,
      reduction=None)
  accumulation = config.gradient_accumulation_steps
  l2 = config.l2_weight_decay
  phase = _Phase(model, frozen)
  decayed = [not v.path.endswith(('gamma', 'beta')) for v in phase.trainable]
  iterations = [id(v) for v in optimizer.variables].index(
      id(optimizer.iterations))

  def loss_of(trainable, non_trainable, images, targets):
    with phase.applied():
      logits, non_trainable = model.stateless_call(
          trainable, non_trainable, images, training=True)
    loss = jnp.mean(loss_fn(targets, logits))
    if l2:  # tensorflow/tpu's L2 on the non-batch-norm weights.
      loss += l2 * sum(jnp.sum(jnp.square(w.astype(jnp.float32))) / 2
                       for w, on in zip(trainable, decayed) if on)
    correct = jnp.sum(jnp.argmax(logits, -1) == jnp.argmax(targets, -1))
    return loss, (non_trainable, correct)

  gradient = jax.value_and_grad(loss_of, has_aux=True)

  def one_step(state, batch):
    images, labels = batch
    targets = (labels if labels.ndim == 2 else
               jax.nn.one_hot(labels, num_classes, dtype=jnp.float32))
    micro = lambda t: t.reshape(accumulation, -1, *t.shape[1:])

    trained, non_trainable = phase.split(state)

    def add(carry, part):
      non_trainable, grads, loss, correct = carry
      (part_loss, (non_trainable, part_correct)), part_grads = gradient(
          trained, non_trainable, *part)
      grads = jax.tree.map(lambda a, b: a + b / accumulation, grads,
                           part_grads)
      return (non_trainable, grads, loss + part_loss / accumulation,
              correct + part_correct), None

    zeros = jax.tree.map(jnp.zeros_like, trained)
    (non_trainable, grads, loss, correct), _ = jax.lax.scan(
        add, (non_trainable, zeros, 0.0, 0), (micro(images), micro(targets)))
    trainable, non_trainable = phase.merge(state, trained, non_trainable)
    trainable, optimizer_state = phase.apply(
        optimizer, state['optimizer'], trainable, grads)
    state = dict(state, trainable=trainable, non_trainable=non_trainable,
                 optimizer=optimizer_state, step=state['step'] + 1)
    if ema:
      state['ema'] = ema.update(state, optimizer_state[iterations])
    return state, (loss, correct)

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
        0, num_steps, body, (state, losses, 0))
    return state, {'loss': jnp.sum(losses) / num_steps,
                   'accuracy': correct / (num_steps * labels.shape[1]),
                   'step_losses': losses}

  return train


def eval_program(model, num_classes, strategy):
  """The jitted eval step: sums of loss, hits, top-5 hits and weights, and
  the confusion matrix of one batch (padding examples weigh 0)."""
  loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True,
                                                 reduction=None)
  top_k = min(5, num_classes)

  @functools.partial(jax.jit, out_shardings=strategy.replicated)
  def evaluate(trainable, non_trainable, images, labels, weights):
    logits, _ = model.stateless_call(trainable, non_trainable, images,
                                     training=False)
    logits = logits.astype(jnp.float32)
    loss = jnp.sum(loss_fn(jax.nn.one_hot(labels, num_classes), logits) *
                   weights)
    predicted = jnp.argmax(logits, -1)
    hits = (predicted == labels).astype(jnp.float32)
    # In the top k: fewer than k classes score higher than the label's.
    label_logit = jnp.take_along_axis(logits, labels[:, None], -1)
    in_top_k = (jnp.sum(logits > label_logit, -1) < top_k).astype(jnp.float32)
    confusion = jnp.zeros((num_classes, num_classes)).at[
        labels, predicted].add(weights)
    sums = jnp.stack([loss, jnp.sum(hits * weights),
                      jnp.sum(in_top_k * weights), jnp.sum(weights)])
    return sums, confusion

  return evaluate
