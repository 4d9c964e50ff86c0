"""The Trainer on JAX: model, optimizer and the compiled multi-step program.

Keras 3.15's JAX trainer runs
`steps_per_execution` as a Python loop around a compiled step (its
on-device loop came later, keras#23527); here one jitted program runs all
of an execution's steps in a `lax.fori_loop` over batches stacked on the
host, with the state as JAX arrays (Keras' stateless_call and
stateless_apply) written back into the Keras variables only to save or
export (programs.py builds the programs).

The model is replicated on every device and each batch split over them;
XLA (GSPMD) inserts the gradient all-reduce. Batch-norm statistics are
computed over the whole global batch (as synchronised batch norm), where
the TensorFlow path normalises per replica and averages the moving
statistics after each execution.
"""

import contextlib
import dataclasses
import hashlib
import time
from typing import Optional

import jax
import jax.numpy as jnp
import keras
import numpy as np
import tensorflow as tf

from pipeline.backends.jax import programs
from pipeline.backends.jax.programs import on_host
from pipeline.data import decode
from pipeline.errors import UserError
from pipeline.run import precision
from pipeline.storage import checkpoint_files
from pipeline.training import models
from pipeline.training import moving_average
from pipeline.training import optimizers


@dataclasses.dataclass
class Trainer:
  """The JAX state of a run and its compiled train and eval programs."""
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  strategy: object  # devices.DataParallel
  state: dict  # trainable, non_trainable, optimizer, ema, step: JAX arrays.
  train_program: object
  eval_program: object
  num_classes: int
  label_offset: int
  out_of_memory: str
  ema: Optional['MovingAverage'] = None
  step_variables: checkpoint_files.Variables = None
  slots: int = 1  # Steps one program call can run: steps_per_execution.
  frozen_steps: int = 0  # Fine-tuning: the first steps train the head alone,
  frozen_program: object = None  # in this program.
  accumulation: int = 1  # Micro-batches per step.
  last_inputs: tuple = None  # The last execution's (images, labels) shapes.

  # --- the Trainer interface (backends/interface.py) ---

  @property
  def step(self):
    return int(on_host(self.state['step']))

  @property
  def skipped_steps(self):
    return self.step - int(self._optimizer_value('iterations'))

  @property
  def loss_scale(self):
    if 'dynamic_scale' not in programs.optimizer_places(self.optimizer):
      return None
    return float(self._optimizer_value('dynamic_scale'))

  def learning_rate(self):
    self.optimizer.iterations.assign(self._optimizer_value('iterations'))
    return float(self.optimizer.learning_rate)

  def _optimizer_value(self, name):
    place = programs.optimizer_places(self.optimizer)[name]
    return on_host(self.state['optimizer'][place])

  def train(self, iterator, num_steps):
    """Runs `num_steps` steps in one compiled program (the interface's
    outputs).

    Batches are stacked to steps_per_execution slots whatever `num_steps`
    is (unused ones zeros, never run), so a short last execution reuses
    the one compiled program instead of compiling another (a minute for
    B0 on a CPU). Before `frozen_steps` the frozen-backbone program runs;
    the loop never lets an execution cross that step.
    """
    program = self.train_program
    if self.frozen_steps and self.step < self.frozen_steps:
      program = self.frozen_program
    start = time.perf_counter()
    with self._errors_in_one_line():  # The input checks the labels.
      batches = [next(iterator) for _ in range(num_steps)]
    wait_s = time.perf_counter() - start
    images, labels = self.strategy.stack(
        [batch[:2] for batch in batches], self.slots)
    # Their shapes only, for step_cost: not the arrays' device memory.
    self.last_inputs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                  sharding=a.sharding)
                             for a in (images, labels))
    with self._errors_in_one_line():
      self.state, outputs = program(self.state, images, labels,
                                    np.int32(num_steps))
      outputs = on_host(outputs)
    return {'loss': float(outputs['loss']),
            'accuracy': float(outputs['accuracy']),
            'input_wait_s': wait_s,
            'skipped_records': sum(int(np.sum(batch[2])) for batch in batches
                                   if len(batch) > 2),
            'step_losses': np.asarray(outputs['step_losses'][:num_steps])}

  def step_cost(self):
    if self.last_inputs is None:
      return {'reason': 'no training step has run'}
    lowered = self.train_program.lower(self.state, *self.last_inputs,
                                       np.int32(1))
    # XLA counts a loop's body once: one step (of the execution's loop) of
    # one micro-batch (of the accumulation's scan). Traced, the program
    # holds the global batch; compiled, each device's share.
    micro_batch = self.last_inputs[0].shape[1] // self.accumulation
    per_device = micro_batch // self.strategy.num_replicas_in_sync
    return {'flops': _cost(lowered.cost_analysis(), 'flops') / micro_batch,
            'bytes': _cost(lowered.compile().cost_analysis(),
                           'bytes accessed') / per_device}

  def evaluate(self, dataset, num_steps):
    """The interface's figures: the averaged weights' with a moving
    average (and the model's own as *_raw)."""
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
        sums, matrix = on_host(
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
      for variable, value in zip(variables, on_host(list(values))):
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
                       written_as=checkpoint_files.KERAS):
    """The local layer of this run's checkpoints: Keras' files of the
    state, written back before each save and read back after each restore;
    or another format's (a run trained on TensorFlow), read into the model,
    the step and the moving average (evaluating needs no optimizer).
    `io_device` is a TPU Node's, which JAX never drives."""
    del io_device
    read_back = lambda missing: self.read_back()
    ema = {'ema': self.ema.variables} if self.ema else {}
    if written_as != checkpoint_files.KERAS:
      return checkpoint_files.reader(
          written_as, dict(model=self.model, step=self.step_variables, **ema),
          directory, after_restore=read_back,
          read_only=f'{directory} holds a run trained on TensorFlow; it '
          'resumes with --backend=tensorflow')
    # The parts in the order the first JAX runs wrote them.
    parts = dict(model=self.model, optimizer=self.optimizer,
                 step=self.step_variables, **ema)
    return checkpoint_files.KerasFiles(
        parts, directory, max_to_keep, before_save=self.write_back,
        after_restore=read_back)

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


def _cost(analysis, key):
  """A figure of XLA's cost analysis (a dict; a list of one in older JAX)."""
  return float((analysis[0] if isinstance(analysis, list) else analysis)[key])


class MovingAverage:
  """The moving average (training/moving_average.py) as a function of the
  JAX state."""

  def __init__(self, model, decay):
    self.decay = decay
    sources = moving_average.averaged(model)
    self.variables = checkpoint_files.Variables('ema', like=sources)
    for average, source in zip(self.variables.values, sources):
      average.assign(source.value)  # The average starts at the weights.
    # Where each averaged weight sits in the state: (trainable?, index).
    trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
    non_trainable = {id(v): i
                     for i, v in enumerate(model.non_trainable_variables)}
    self.places = [('trainable', trainable[id(v)]) if id(v) in trainable else
                   ('non_trainable', non_trainable[id(v)]) for v in sources]
    self.trainer = None

  def of(self, state):
    """The averaged variables' current values in `state`."""
    return [state[kind][index] for kind, index in self.places]

  def update(self, state, num_updates):
    """The averages after one applied update (the `num_updates`th)."""
    decay = moving_average.decay_at(self.decay, num_updates)
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
    for variable, value in zip(variables, on_host(trainable + non_trainable)):
      variable.assign(value)
    try:
      yield
    finally:
      for variable, value in zip(variables, on_host(
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
  if plan.frozen_steps and plan.precision.loss_scaling:
    raise UserError(f'freeze_backbone_epochs with --policy={plan.policy} '
                    'runs on --backend=tensorflow; on JAX use '
                    'mixed_bfloat16 or float32 for fine-tuning')
  hardware = plan.hardware
  num_classes = plan.source.num_classes
  precision.apply(plan.precision)
  keras.utils.set_random_seed(config.seed)
  model = models.model_of_run(config, plan)
  optimizer = optimizers.optimizer_of_run(config, plan)
  optimizer.build(model.trainable_variables)
  step_variables = checkpoint_files.Variables('step', shapes=[()],
                                              dtype='int32')
  ema = MovingAverage(model, config.ema_decay) if config.ema_decay else None
  strategy = hardware.strategy
  trainer = Trainer(
      model, optimizer, strategy,
      _state_of(model, optimizer, step_variables, ema, strategy),
      programs.train_program(model, optimizer, config, num_classes, strategy,
                             ema),
      programs.eval_program(model, num_classes, strategy),
      num_classes, config.label_offset,
      plan.out_of_memory_message(config), ema=ema,
      step_variables=step_variables, slots=plan.steps_per_execution,
      accumulation=config.gradient_accumulation_steps,
      frozen_steps=plan.frozen_steps,
      frozen_program=(programs.train_program(
          model, optimizer, config, num_classes, strategy, ema, frozen=True)
                      if plan.frozen_steps else None))
  if ema:
    ema.trainer = trainer
  return trainer
