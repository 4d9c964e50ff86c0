"""Train and evaluate one run, top to bottom.

train_and_evaluate() is the whole run: check the config, build input, model
and optimizer inside the strategy scope, restore the newest checkpoint, loop
over compiled multi-step executions with progress output, checkpoints and
TensorBoard scalars, then evaluate, export and write metrics.json.
"""

import dataclasses
import os
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from pipeline import data
from pipeline import models
from pipeline import precision
from pipeline import steps as steps_lib
from pipeline import storage
from pipeline.checkpoint import Checkpointer
from pipeline.errors import UserError

# Fields that must match for a workdir's checkpoints to be restorable.
_RUN_IDENTITY = ('dataset', 'model', 'image_size')


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything resolved before training: printed, saved, and used."""
  hardware: object
  policy: str
  policy_reason: str
  xla: bool
  xla_reason: str
  workdir: str

  def summary(self, config):
    hw = self.hardware
    per_replica = config.global_batch_size // hw.num_replicas
    return {
        'device_kind': hw.device_kind,
        'devices': hw.detail,
        'strategy': hw.strategy_name,
        'num_replicas': hw.num_replicas,
        'num_workers': hw.num_workers,
        'policy': self.policy,
        'policy_reason': self.policy_reason,
        'loss_scaling': precision.needs_loss_scaling(self.policy),
        'xla': self.xla,
        'xla_reason': self.xla_reason,
        'global_batch_size': config.global_batch_size,
        'per_replica_batch_size': per_replica,
        'steps_per_execution': config.steps_per_execution,
        'workdir': self.workdir,
    }


def choose_xla(requested, hardware):
  """Returns (on, reason) for --xla=auto|on|off on this hardware."""
  if hardware.device_kind == 'TPU':
    return True, 'TPU programs are always compiled by XLA'
  if requested == 'on':
    return True, 'asked for with --xla=on'
  if requested == 'off':
    return False, 'asked for with --xla=off'
  if hardware.num_replicas > 1:
    return False, ('fails under Mirrored strategies in Keras 3 (keras#21366, '
                   'keras#18666)')
  if hardware.device_kind == 'GPU':
    return True, 'single GPU: fused kernels help'
  return False, 'CPU: XLA measured 8x slower than TF kernels here'


def validate(config, hardware):
  """Raises a one-line UserError for config values that cannot run."""
  replicas = hardware.num_replicas
  if config.global_batch_size < 1 or config.global_batch_size % replicas:
    raise UserError(f'global_batch_size={config.global_batch_size} does not '
                    f'split over {replicas} replicas; use a multiple of '
                    f'{replicas}')
  for key in ('epochs', 'steps_per_execution', 'log_every_steps',
              'checkpoint_every_steps', 'keep_checkpoints'):
    if config[key] < 1:
      raise UserError(f'{key}={config[key]} must be 1 or more')
  if config.model not in models.MODELS:
    raise UserError(f'unknown model {config.model!r}; accepted: '
                    f'{", ".join(models.MODELS)}')
  if config.augment not in data.AUGMENTATIONS:
    raise UserError(f'unknown augment {config.augment!r}; accepted: '
                    f'{", ".join(data.AUGMENTATIONS)}')


def _check_same_run(workdir, config):
  saved = storage.read_json(os.path.join(workdir, 'run.json'))
  if not saved:
    return
  for key in _RUN_IDENTITY:
    if saved['config'].get(key) != config[key]:
      raise UserError(
          f'workdir {workdir!r} holds a run with {key}='
          f'{saved["config"].get(key)!r}, not {config[key]!r}; use another '
          '--workdir to start a new run')


def _log_plan(summary):
  logging.info('Run: %s (%s) with %s, %d replica(s) over %d worker(s)',
               summary['device_kind'], summary['devices'],
               summary['strategy'], summary['num_replicas'],
               summary['num_workers'])
  logging.info('Precision: %s (%s); loss scaling %s', summary['policy'],
               summary['policy_reason'],
               'on' if summary['loss_scaling'] else 'off')
  logging.info('XLA: %s (%s)', 'on' if summary['xla'] else 'off',
               summary['xla_reason'])
  logging.info('Batch: %d global, %d per replica; %d steps per execution',
               summary['global_batch_size'], summary['per_replica_batch_size'],
               summary['steps_per_execution'])
  logging.info('Workdir: %s', summary['workdir'])


def _loss_scale(optimizer):
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return float(optimizer.dynamic_scale.numpy())
  return None


def _writers(workdir, is_chief):
  if not is_chief:
    return tf.summary.create_noop_writer(), tf.summary.create_noop_writer()
  root = os.path.join(workdir, 'tensorboard')
  return (tf.summary.create_file_writer(os.path.join(root, 'train')),
          tf.summary.create_file_writer(os.path.join(root, 'eval')))


def _export(model, workdir, is_chief):
  """Saves a float32-probability SavedModel to <workdir>/export, atomically."""
  target = os.path.join(workdir, 'export')
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  models.with_softmax(model).export(staging, verbose=False)
  if is_chief:
    storage.replace_dir(staging, target)
  else:
    tf.io.gfile.rmtree(staging)
  return target


def train_and_evaluate(config, plan):
  """Runs training to `config.epochs`, resuming if the workdir has a checkpoint."""
  hardware, workdir = plan.hardware, plan.workdir
  strategy = hardware.strategy
  validate(config, hardware)
  if hardware.is_chief:
    storage.check_writable(workdir)
    _check_same_run(workdir, config)
  source = data.load_source(config)

  global_batch = config.global_batch_size
  steps_per_epoch = source.num_train_examples // global_batch
  if steps_per_epoch < 1:
    raise UserError(f'global_batch_size={global_batch} is larger than the '
                    f'{source.num_train_examples} training examples')
  total_steps = config.epochs * steps_per_epoch

  summary = plan.summary(config)
  summary.update(dataset=config.dataset, train_examples=source.num_train_examples,
                 eval_examples=source.num_eval_examples,
                 num_classes=source.num_classes, total_steps=total_steps)
  _log_plan(summary)
  if hardware.is_chief:
    storage.write_json(os.path.join(workdir, 'run.json'),
                       {'resolved': summary, 'config': config.to_dict()})

  keras.mixed_precision.set_global_policy(plan.policy)
  keras.utils.set_random_seed(config.seed)
  with strategy.scope():
    model = models.build_model(config.model, source.num_classes,
                               config.image_size, config.dropout_rate,
                               config.batch_norm_momentum)
    optimizer = precision.wrap_optimizer(
        steps_lib.make_optimizer(config, global_batch, total_steps,
                                 steps_per_epoch), plan.policy)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name='step',
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  checkpointer = Checkpointer(workdir, config.keep_checkpoints,
                              hardware.is_chief, model=model,
                              optimizer=optimizer, step=step)
  checkpointer.restore_latest()
  initial_step = int(step.numpy())

  train_fn = steps_lib.make_train_function(
      model, optimizer, strategy, global_batch, source.num_classes,
      config.label_smoothing, step,
      jit_compile=plan.xla and hardware.device_kind != 'TPU')
  eval_fn = steps_lib.make_eval_function(model, strategy, source.num_classes)
  train_data = strategy.distribute_datasets_from_function(
      data.train_input_fn(config, source, global_batch))
  eval_data = strategy.distribute_datasets_from_function(
      data.eval_input_fn(config, source, global_batch))
  num_eval_steps = data.eval_steps(source, global_batch)
  train_writer, eval_writer = _writers(workdir, hardware.is_chief)

  def evaluate(at_step):
    result = {k: float(v) for k, v in
              eval_fn(iter(eval_data), tf.constant(num_eval_steps)).items()}
    logging.info('Eval at step %d: accuracy %.4f, loss %.4f over %d examples',
                 at_step, result['accuracy'], result['loss'],
                 result['examples'])
    with eval_writer.as_default(step=at_step):
      tf.summary.scalar('accuracy', result['accuracy'])
      tf.summary.scalar('loss', result['loss'])
    return result

  if initial_step:
    logging.info('Resuming at step %d of %d', initial_step, total_steps)
  iterator = iter(train_data)
  timed_s = wait_s = 0.0  # Over executions after the first (compiling) one.
  timed_steps = 0
  window_start, window_steps = time.perf_counter(), 0
  current = initial_step
  first = True
  while current < total_steps:
    num_steps = min(config.steps_per_execution, total_steps - current)
    start = time.perf_counter()
    out = {k: float(v) for k, v in train_fn(iterator, tf.constant(num_steps)).items()}
    elapsed = time.perf_counter() - start
    previous, current = current, current + num_steps
    if first:
      logging.info('First execution (tracing and compiling included): %.1f s',
                   elapsed)
      window_start, first = time.perf_counter(), False
    else:
      timed_s += elapsed
      wait_s += out['input_wait_s']
      timed_steps += num_steps
      window_steps += num_steps
    if not np.isfinite(out['loss']) and not precision.needs_loss_scaling(
        plan.policy):
      raise FloatingPointError(f'training loss is {out["loss"]} at step '
                               f'{current}')

    if current // config.log_every_steps > previous // config.log_every_steps \
        or current == total_steps:
      window_s = time.perf_counter() - window_start
      rate = window_steps * global_batch / window_s if window_steps else 0.0
      skipped = current - int(optimizer.iterations.numpy())
      loss_scale = _loss_scale(optimizer)
      lr = float(optimizer.learning_rate)
      logging.info(
          'step %d/%d (epoch %.1f): loss %.4f, accuracy %.3f, lr %.2e, '
          '%.0f img/s, input wait %.0f%%%s', current, total_steps,
          current / steps_per_epoch, out['loss'], out['accuracy'], lr, rate,
          100 * wait_s / timed_s if timed_s else 0.0,
          f', loss scale {loss_scale:g}, skipped {skipped}'
          if loss_scale is not None else '')
      with train_writer.as_default(step=current):
        tf.summary.scalar('loss', out['loss'])
        tf.summary.scalar('accuracy', out['accuracy'])
        tf.summary.scalar('learning_rate', lr)
        tf.summary.scalar('images_per_sec', rate)
        if loss_scale is not None:
          tf.summary.scalar('loss_scale', loss_scale)
          tf.summary.scalar('skipped_steps', skipped)
      window_start, window_steps = time.perf_counter(), 0

    if (current // config.checkpoint_every_steps >
        previous // config.checkpoint_every_steps or current == total_steps):
      checkpointer.save(current)
    if (config.eval_every_epochs and current < total_steps and
        current // (steps_per_epoch * config.eval_every_epochs) >
        previous // (steps_per_epoch * config.eval_every_epochs)):
      evaluate(current)

  final = evaluate(total_steps)
  export_dir = _export(model, workdir, hardware.is_chief)
  metrics = {
      'policy': plan.policy,
      'strategy': hardware.strategy_name,
      'num_replicas': hardware.num_replicas,
      'num_workers': hardware.num_workers,
      'device_kind': hardware.device_kind,
      'xla': plan.xla,
      'model': config.model,
      'dataset': config.dataset,
      'image_size': config.image_size,
      'global_batch_size': global_batch,
      'steps_per_execution': config.steps_per_execution,
      'initial_step': initial_step,
      'train_steps': total_steps - initial_step,
      'total_steps': total_steps,
      'train_images_per_sec': (timed_steps * global_batch / timed_s
                               if timed_s else None),
      'input_wait_fraction': wait_s / timed_s if timed_s else None,
      'skipped_steps': total_steps - int(optimizer.iterations.numpy()),
      'final_loss_scale': _loss_scale(optimizer),
      'eval_accuracy': final['accuracy'],
      'eval_loss': final['loss'],
      'eval_examples': int(final['examples']),
      'export_dir': export_dir,
  }
  if hardware.is_chief:
    storage.write_json(os.path.join(workdir, 'metrics.json'), metrics)
  logging.info('Done: eval_accuracy %.4f, %s img/s; metrics in %s',
               final['accuracy'],
               f'{metrics["train_images_per_sec"]:.0f}'
               if metrics['train_images_per_sec'] else 'n/a',
               os.path.join(workdir, 'metrics.json'))
  return metrics
