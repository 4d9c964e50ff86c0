"""The Trainer on TensorFlow: model, optimizer and compiled multi-step
functions, built inside the run's strategy.

`build(plan)` applies the precision policy and the seed, builds
everything in the strategy scope and compiles the multi-step functions
(steps.py); each call turns the errors a user can act on into one line.
"""

import contextlib
import dataclasses
import hashlib
from typing import Optional

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from pipeline.backends import hlo_cost
from pipeline.backends.tensorflow import dali_input
from pipeline.backends.tensorflow import ema as ema_lib
from pipeline.backends.tensorflow import graph_rewrite
from pipeline.backends.tensorflow import steps
from pipeline.backends.tensorflow.workers import peers_lost_in_one_line
from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.data import decode
from pipeline.data import spent_iterators
from pipeline.errors import UserError
from pipeline.rules.speed import precision
from pipeline.storage import checkpoint_files
from pipeline.storage.checkpoint_format import Format
from pipeline.recipe import models
from pipeline.recipe import optimizers


@dataclasses.dataclass
class Trainer:
  """Model, optimizer and compiled steps, built inside the strategy scope."""
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  # Every step taken; optimizer.iterations: those applied.
  step_counter: tf.Variable
  train_fn: object
  eval_fn: object
  num_classes: int
  label_offset: int
  out_of_memory: str  # The one line for a ResourceExhaustedError.
  ema: Optional[ema_lib.MovingAverage] = None
  # Fine-tuning's first phase: steps before this one train the head alone,
  # with its own compiled function (the variables it updates differ).
  frozen_steps: int = 0
  frozen_train_fn: object = None
  input_files: tuple = ()  # DALI's: named if it cannot decode a record.
  cost: object = None  # () -> step_cost's dict.
  io_device: Optional[str] = None  # Plan.io_device: a TPU Node's files.

  def trackables(self):
    """What a checkpoint of this run holds, by name."""
    found = dict(model=self.model, optimizer=self.optimizer,
                 step=self.step_counter)
    if self.ema:
      found['ema'] = self.ema.trackable
    return found

  def checkpoint_files(self, directory, max_to_keep,
                       written_as=Format.TF_CHECKPOINT):
    """The local layer of this run's checkpoints: TensorFlow's own, or
    another format's (a run trained on JAX), read into the model, the step
    and the moving average (evaluating needs no optimizer)."""
    if written_as is Format.TF_CHECKPOINT:
      return checkpoint_files.TensorFlowFiles(self.trackables(), directory,
                                              max_to_keep, self.io_device)
    return _OtherBackendsFiles(self, written_as, directory)

  def compiled_programs(self):
    functions = [self.train_fn, self.frozen_train_fn]
    return sum(f.experimental_get_tracing_count() for f in functions if f)

  def read_back(self):
    """Nothing to do: the variables are this trainer's state."""

  @property
  def step(self):
    return int(self.step_counter.numpy())

  @property
  def skipped_steps(self):
    return self.step - int(self.optimizer.iterations.numpy())

  @property
  def loss_scale(self):
    if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      return float(self.optimizer.dynamic_scale.numpy())
    return None

  def learning_rate(self):
    return float(self.optimizer.learning_rate)

  def train(self, iterator, num_steps):
    """Runs `num_steps` training steps; their mean loss etc. as floats.

    Before `frozen_steps` the backbone is frozen (its batch norm then runs
    in inference mode, as in Keras' transfer-learning guide); the loop
    never lets an execution cross that step.
    """
    frozen = False
    if self.frozen_steps:
      frozen = self.step < self.frozen_steps
      # Set before every call: a function (re)traces with the state it sees.
      models.backbone(self.model).trainable = not frozen
    return self._run(self.frozen_train_fn if frozen else self.train_fn,
                     iterator, num_steps)

  def evaluate(self, dataset, num_steps):
    """Evaluates on `num_steps` batches of `dataset`: loss, accuracy,
    top5_accuracy and examples as floats, the confusion matrix as a numpy
    array. With a moving average, those are the averaged weights' (what is
    exported) and loss_raw, accuracy_raw, top5_accuracy_raw the model's own.
    """
    if not self.ema:
      return self._evaluate(dataset, num_steps)
    raw = self._evaluate(dataset, num_steps)
    with self.ema.applied_to_model():
      result = self._evaluate(dataset, num_steps)
    return dict(result, **{f'{key}_raw': raw[key] for key in
                           ('loss', 'accuracy', 'top5_accuracy')})

  def _evaluate(self, dataset, num_steps):
    iterator = iter(dataset)
    try:
      return self._run(self.eval_fn, iterator, num_steps)
    finally:
      spent_iterators.release(iterator)

  def exported_weights(self):
    """A context in which the model holds what is exported: the moving
    average if there is one, else its own weights."""
    return (self.ema.applied_to_model() if self.ema else
            contextlib.nullcontext())

  def weights_sha256(self):
    """SHA-256 of every weight: equal digests mean equal models."""
    digest = hashlib.sha256()
    for weight in self.model.weights:
      digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return digest.hexdigest()

  def step_cost(self):
    return self.cost()

  def _run(self, function, iterator, num_steps):
    try:
      with peers_lost_in_one_line():
        outputs = function(iterator, tf.constant(num_steps))
      return {key: float(value) if value.shape.rank == 0 else value.numpy()
              for key, value in outputs.items()}
    except tf.errors.ResourceExhaustedError:
      raise UserError(self.out_of_memory) from None
    except tf.errors.OpError as e:
      message = decode.label_error(e, self.num_classes, self.label_offset) or (
          self.input_files and dali.failure_message(e, self.input_files))
      if message:
        raise UserError(message) from None
      raise


def build(plan):
  """Sets the policy and seed, then builds everything in the strategy scope."""
  try:
    return _build(plan)
  except tf.errors.ResourceExhaustedError:
    raise UserError(plan.out_of_memory_message()) from None


def _build(plan):
  config = plan.recipe
  hardware = plan.hardware
  strategy = hardware.strategy
  num_classes = plan.source.num_classes
  precision.apply(plan.precision)
  if plan.policy == precision.REWRITE:
    # Before anything is traced: grappler rewrites functions as they run.
    logging.info('Graph rewrite: eligible ops compute in %s',
                 graph_rewrite.enable_graph_rewrite(hardware.device_kind))
  keras.utils.set_random_seed(config.seed)
  with strategy.scope():
    model = models.model_of_run(plan)
    optimizer = optimizers.optimizer_of_run(plan)
    # Built now, so a checkpoint restores into existing slots (the frozen
    # backbone's too: they wait, unchanged, for the whole-model phase).
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name='step',
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    ema = (ema_lib.MovingAverage(model, config.ema_decay)
           if config.ema_decay else None)

  train_checks, eval_checks = _input_checks(plan)

  def train_function():
    return steps.make_train_function(
        model, optimizer, strategy, plan.global_batch_size, plan.objective,
        step,
        # TPUs compile the whole program anyway; elsewhere XLA is per step.
        jit_compile=plan.xla and hardware.device_kind != 'TPU',
        accumulation_steps=config.gradient_accumulation_steps, ema=ema,
        **train_checks)

  eval_fn = steps.make_eval_function(model, strategy, num_classes,
                                     **eval_checks)
  return Trainer(model, optimizer, step, train_function(), eval_fn,
                 num_classes, plan.source.label_offset,
                 plan.out_of_memory_message(), ema=ema,
                 frozen_steps=plan.frozen_steps,
                 frozen_train_fn=(train_function() if plan.frozen_steps
                                  else None),
                 input_files=(plan.source.all_record_files()
                              if plan.input_pipeline is input_pipeline_lib.Pipeline.DALI else ()),
                 cost=lambda: step_cost(plan),
                 io_device=plan.io_device)


def _input_checks(plan):
  """The keyword arguments of the train and eval functions for what the
  input cannot do itself: DALI's datasets end at the DALIDataset, so its
  labels are checked and evaluation's weights made in the steps."""
  if plan.input_pipeline is not input_pipeline_lib.Pipeline.DALI:
    return {}, {}
  num_classes = plan.source.num_classes
  files = plan.source.record_files
  return ({'check_labels': dali_input.label_check(num_classes,
                                                  files['train'])},
          {'check_labels': dali_input.label_check(num_classes, files['eval']),
           'weights_at': dali_input.eval_weights(
               plan.source.num_eval_examples, plan.hardware.num_replicas,
               plan.global_batch_size)})


def step_cost(plan):
  """The Trainer's step_cost: one replica's forward and backward pass (the
  step's own gradient function) as XLA sees it before optimising
  (backends/hlo_cost.py), on a model and optimizer built again outside
  the strategy, whose variables live on one device (the run's may be
  mirrored over several)."""
  micro_batch = (plan.per_replica_batch_size //
                 plan.recipe.gradient_accumulation_steps)
  model = models.model_of_run(plan)
  optimizer = optimizers.optimizer_of_run(plan)
  optimizer.build(model.trainable_variables)  # A loss scale's variables.
  gradients = steps.gradient_function(model, optimizer, plan.global_batch_size,
                                      plan.objective)
  size = plan.image_sizes.train
  hlo_text = lambda: tf.function(jit_compile=True)(
      lambda images, labels: gradients(model.trainable_variables, images,
                                       labels)).experimental_get_compiler_ir(
          tf.zeros((micro_batch, size, size, 3), tf.uint8),
          tf.zeros((micro_batch,), tf.int32))(stage='hlo')
  return hlo_cost.per_image(hlo_text, micro_batch, _jax_cpu_client)


def _jax_cpu_client():
  """JAX's CPU client, without starting any other JAX platform: in a fresh
  process `jax.devices('cpu')` would initialise every platform installed,
  CUDA's too, beside TensorFlow's hold on the GPUs."""
  import jax  # pylint: disable=g-import-not-at-top
  if not jax.config.jax_platforms:
    jax.config.update('jax_platforms', 'cpu')
  return jax.devices('cpu')[0].client


class _OtherBackendsFiles:
  """Another backend's checkpoints (read only), restored into stand-ins
  shaped as that backend saves them (the step, the averages as one list),
  then, as this trainer's own step after storage's, into its step counter
  and moving average."""

  def __init__(self, trainer, written_as, directory):
    self.trainer = trainer
    self.step = checkpoint_files.Variables('step', shapes=[()], dtype='int32')
    parts = dict(model=trainer.model, step=self.step)
    if trainer.ema:
      parts['ema'] = checkpoint_files.Variables('ema', like=trainer.ema.sources)
    self.averages = parts.get('ema')
    self.files = checkpoint_files.reader(
        written_as, parts, directory,
        read_only=f'{directory} holds a run trained on another backend, '
        'which resumes there only')

  def save(self, step):
    return self.files.save(step)  # Read only: raises its line.

  def restore(self, path, optional=()):
    missing = self.files.restore(path, optional)
    self.trainer.step_counter.assign(int(self.step.values[0].numpy()))
    if self.averages and 'ema' not in missing:
      for average, value in zip(self.trainer.ema.averages.values,
                                self.averages.values):
        average.assign(value.numpy())
    return missing

  def latest(self):
    return self.files.latest()

  def paths(self, directory):
    return self.files.paths(directory)
