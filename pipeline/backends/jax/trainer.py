"""The Trainer on JAX: model, optimizer and the compiled step.

As Keras 3.15.1's JAX trainer (the pinned release's `_make_function`),
an execution is a Python loop that
dispatches one compiled step per batch (programs.py says why no program
loops), with the state a pytree of JAX arrays (train_state.TrainState;
Keras' stateless_call and stateless_apply) written into the Keras
variables only to save or export: the trainer's own step before storage's
save, and after its restore the reverse (_StateFiles). The next execution's batches move to the devices while the queued
steps run (staging.py).

The Trainer holds what the loop calls (interface.Trainer): the state, its
checkpoint files in Keras' format (a TensorFlow run's read too), the
frozen-backbone phase, the moving average, the loss scale's figures; the
programs themselves, and how they split the batch, are programs.py's.
"""

import contextlib
import dataclasses
import hashlib
from typing import Optional

import jax
import jax.numpy as jnp
import keras
import numpy as np
from absl import logging

from pipeline.backends import hlo_cost
from pipeline.backends.jax import devices
from pipeline.backends.jax import ema as ema_lib
from pipeline.backends.jax import programs
from pipeline.backends.jax import staging as staging_lib
from pipeline.backends.jax.programs import on_host
from pipeline.data import decode
from pipeline.data import spent_iterators
from pipeline.errors import UserError
from pipeline.rules.speed import autotune
from pipeline.rules.speed import precision
from pipeline.rules.speed import step_counts
from pipeline.storage import checkpoint_files
from pipeline.storage.checkpoint_format import Format
from pipeline.recipe import models
from pipeline.recipe import moving_average
from pipeline.recipe import optimizers


@dataclasses.dataclass
class Trainer:
  """The JAX state of a run and its compiled train and eval programs."""
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  strategy: object  # devices.DataParallel
  state: dict  # trainable, non_trainable, optimizer, ema, step: JAX arrays.
  train_step: object
  eval_program: object
  num_classes: int
  label_offset: int
  out_of_memory: str
  ema: Optional[ema_lib.MovingAverage] = None
  step_variables: checkpoint_files.Variables = None
  slots: int = 1  # Steps staged ahead: steps_per_execution.
  frozen_steps: int = 0  # Fine-tuning: the first steps train the head alone,
  frozen_step: object = None  # with this step.
  accumulation: int = 1  # Micro-batches per step.
  last_inputs: tuple = None  # The last execution's (images, labels) shapes.
  staging: staging_lib.Staging = None  # The next execution's batches.
  gradient_program: object = None  # One loop-free pass, for step_cost.
  # The saved autotune picks XLA loaded (rules/speed/autotune.py), which
  # the first execution's convolutions are compared with once.
  picks_to_compare: str = None

  def __post_init__(self):
    self.staging = self.staging or staging_lib.Staging(
        self.strategy, step_counts.STAGED_INPUT_BYTES_PER_DEVICE)

  # --- the Trainer interface (backends/interface.py) ---

  @property
  def step(self):
    return int(on_host(self.state.step))

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
    return on_host(self.state.optimizer[place])

  def train(self, iterator, num_steps):
    """Dispatches `num_steps` steps (the interface's outputs), then stages
    the next execution's batches on the devices while they run
    (staging.py). Before `frozen_steps` the frozen-backbone step runs; the
    loop never lets an execution cross that step."""
    step = self.train_step
    if self.frozen_steps and self.step < self.frozen_steps:
      step = self.frozen_step
    with self._errors_in_one_line():  # The input checks the labels.
      batches, skipped, wait_s = self.staging.take(iterator, num_steps)
    # Their shapes only, for step_cost: not the arrays' device memory.
    self.last_inputs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                  sharding=a.sharding)
                             for a in batches[0])
    outputs = []
    with self._errors_in_one_line():
      for images, labels in batches:
        self.state, output = step(self.state, images, labels)
        outputs.append(output)
      # Dispatched, not finished: the next execution's input moves now.
      wait_s += self.staging.stage(iterator, self.slots, outputs)
      losses, correct, grad_norms = np.asarray(on_host(outputs)).T
    if self.picks_to_compare:
      self._compare_picks(step)
    return {'loss': float(losses.mean()),
            'grad_norm': _finite_mean(grad_norms),
            'accuracy': float(correct.sum() / (num_steps * self.last_inputs[
                1].shape[0])),
            'input_wait_s': wait_s, 'skipped_records': skipped,
            'step_losses': losses}

  def _compare_picks(self, step):
    """Once, after the first execution compiled: its convolutions'
    algorithms against the saved picks XLA loaded, in one line."""
    path, self.picks_to_compare = self.picks_to_compare, None
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=a.sharding), self.state)
    # The persistent compile cache serves it: the same program.
    text = step.lower(spec, *self.last_inputs).compile().as_text()
    logging.info('%s', autotune.picks_line(autotune.differing_picks(
        text, autotune.saved_convolutions(path)), path))

  def compiled_programs(self):
    # jax.jit's own count of the programs it traced, one per input shape.
    return sum(step._cache_size()  # pylint: disable=protected-access
               for step in (self.train_step, self.frozen_step) if step)

  def step_cost(self):
    if self.last_inputs is None or self.gradient_program is None:
      return {'reason': 'no training step has run'}
    images, labels = self.last_inputs
    micro_batch = images.shape[0] // self.accumulation
    micro = lambda a: jax.ShapeDtypeStruct(
        (micro_batch, *a.shape[1:]), a.dtype,
        sharding=self.strategy.batch_sharding())
    return hlo_cost.per_image(
        lambda: self.gradient_program.lower(
            self.state, micro(images), micro(labels)).as_text(dialect='hlo'),
        micro_batch, lambda: jax.devices('cpu')[0].client)

  def evaluate(self, dataset, num_steps):
    """The interface's figures: the averaged weights' with a moving
    average (and the model's own as *_raw)."""
    raw = self._evaluate(dataset, num_steps, self.state.trainable,
                         self.state.non_trainable)
    if not self.ema:
      return raw
    trainable, non_trainable = self.ema.as_model_state(self.state)
    result = self._evaluate(dataset, num_steps, trainable, non_trainable)
    return dict(result, **{f'{key}_raw': raw[key] for key in
                           ('loss', 'accuracy', 'top5_accuracy')})

  def _evaluate(self, dataset, num_steps, trainable, non_trainable):
    """Sums over `num_steps` batches, added on the devices: each batch is
    placed while the one before it is evaluated (dispatch returns at once),
    and the host waits only for the totals."""
    totals = None
    iterator = iter(dataset)
    with self._errors_in_one_line():
      for _ in range(num_steps):
        batch = self.strategy.to_devices(next(iterator))
        sums = self.eval_program(trainable, non_trainable, *batch)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals,
                                                          sums)
      sums, confusion = on_host(totals)
    spent_iterators.release(iterator)
    loss, correct, correct_top_k, examples = (float(x) for x in sums)
    return {'loss': loss / examples, 'accuracy': correct / examples,
            'top5_accuracy': correct_top_k / examples, 'examples': examples,
            'confusion': np.asarray(confusion, np.float64)}

  def write_back(self):
    """Writes the JAX state into the Keras variables (model, optimizer,
    step, averages): before a save, an export or a digest."""
    for variables, values in (
        (self.model.trainable_variables, self.state.trainable),
        (self.model.non_trainable_variables, self.state.non_trainable),
        (self.optimizer.variables, self.state.optimizer),
        (self.step_variables.values, [self.state.step]),
        (self.ema.variables.values if self.ema else [],
         self.ema.values(self.state.ema) if self.ema else [])):
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

  def checkpoint_files(self, directory, max_to_keep,
                       written_as=Format.KERAS_WEIGHTS):
    """The local layer of this run's checkpoints: Keras' files of the
    state, written back before each save and read back after each restore;
    or another format's (a run trained on TensorFlow), read into the model,
    the step and the moving average (evaluating needs no optimizer)."""
    ema = {'ema': self.ema.variables} if self.ema else {}
    if written_as is not Format.KERAS_WEIGHTS:
      return _StateFiles(self, checkpoint_files.reader(
          written_as, dict(model=self.model, step=self.step_variables, **ema),
          directory, read_only=f'{directory} holds a run trained on '
          'TensorFlow; it resumes with --backend=tensorflow'))
    # The parts in the order the first JAX runs wrote them.
    parts = dict(model=self.model, optimizer=self.optimizer,
                 step=self.step_variables, **ema)
    return _StateFiles(self, checkpoint_files.KerasFiles(
        parts, directory, max_to_keep))

  @contextlib.contextmanager
  def _errors_in_one_line(self):
    try:
      with devices.peers_lost_in_one_line():
        yield
    except jax.errors.JaxRuntimeError as e:
      if 'RESOURCE_EXHAUSTED' in str(e):
        raise UserError(self.out_of_memory) from None
      raise
    except decode.LABEL_CHECK_FAILED as e:
      message = decode.label_error(e, self.num_classes, self.label_offset)
      if message:
        raise UserError(message) from None
      raise


class _StateFiles:
  """Storage's files of the Keras variables, with this trainer's own steps
  around them: its JAX state written into the variables before a save, and
  taken from them after a restore."""

  def __init__(self, trainer, files):
    self.trainer, self.files = trainer, files

  def save(self, step):
    self.trainer.write_back()
    return self.files.save(step)

  def restore(self, path, optional=()):
    missing = self.files.restore(path, optional)
    self.trainer.read_back()
    return missing

  def latest(self):
    return self.files.latest()

  def paths(self, directory):
    return self.files.paths(directory)


def _finite_mean(values):
  """The mean of the finite values (a float16 step that overflowed has an
  infinite norm, and skips its update); inf where none is."""
  finite = values[np.isfinite(values)]
  return float(finite.mean()) if finite.size else float('inf')


def _state_of(model, optimizer, step_variables, ema, strategy):
  """The run's state as JAX arrays, from the Keras variables."""
  return programs.initial_state(
      model, optimizer, strategy, step_variables.values[0].value,
      [v.value for v in ema.variables.values] if ema else None)


def build(plan):
  """Sets the policy and seed, builds the model and the two programs."""
  if plan.frozen_steps and plan.precision.loss_scaling:
    raise UserError(f'freeze_backbone_epochs with --policy={plan.policy} '
                    'runs on --backend=tensorflow; on JAX use '
                    'mixed_bfloat16 or float32 for fine-tuning')
  config, hardware = plan.recipe, plan.hardware
  num_classes = plan.source.num_classes
  accumulation = config.gradient_accumulation_steps
  precision.apply(plan.precision)
  keras.utils.set_random_seed(config.seed)
  model = models.model_of_run(plan)
  optimizer = optimizers.optimizer_of_run(plan)
  optimizer.build(model.trainable_variables)
  step_variables = checkpoint_files.Variables('step', shapes=[()],
                                              dtype='int32')
  ema = None
  if config.ema_decay:
    ema = ema_lib.MovingAverage(model, config.ema_decay, checkpoint_files.Variables(
        'ema', like=moving_average.averaged(model)))
  strategy, objective = hardware.strategy, plan.objective
  state = _state_of(model, optimizer, step_variables, ema, strategy)
  train_step = programs.train_step(model, optimizer, objective, strategy,
                                   ema, accumulation=accumulation)
  frozen_step = (programs.train_step(model, optimizer, objective, strategy,
                                     ema, frozen=True,
                                     accumulation=accumulation)
                 if plan.frozen_steps else None)
  gradient_program = programs.gradient_program(model, optimizer, objective,
                                               strategy)
  trainer = Trainer(
      model, optimizer, strategy, state, train_step,
      programs.eval_program(model, num_classes, strategy),
      num_classes, plan.source.label_offset,
      plan.out_of_memory_message(), ema=ema,
      step_variables=step_variables, slots=plan.steps_per_execution,
      accumulation=accumulation, frozen_steps=plan.frozen_steps,
      picks_to_compare=autotune.loaded(),
      gradient_program=gradient_program, frozen_step=frozen_step)
  if ema:
    ema.trainer = trainer
  return trainer
