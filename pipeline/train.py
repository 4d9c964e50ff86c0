"""Train and evaluate one run, top to bottom.

train_and_evaluate() is the whole run: check the config, build input, model
and optimizer inside the strategy scope, restore the newest checkpoint, loop
over compiled multi-step executions with progress output, checkpoints and
TensorBoard scalars, then evaluate, export and write metrics.json.
"""

import dataclasses
import hashlib
import os
import resource
import signal
import tempfile
import threading
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
from pipeline.errors import Preempted
from pipeline.errors import UserError
from pipeline.errors import first_line

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
  workdir: str  # A local path or gs://bucket/prefix.
  staging_dir: str = '/tmp/pipeline-staging'  # Local copy of a gs:// workdir.

  def steps_per_execution(self, config):
    """Steps per compiled call: config.steps_per_execution, 0 picked here."""
    return choose_steps_per_execution(config.steps_per_execution,
                                      self.hardware.device_kind)[0]

  def summary(self, config):
    hw = self.hardware
    per_replica = config.global_batch_size // hw.num_replicas
    steps, steps_reason = choose_steps_per_execution(
        config.steps_per_execution, hw.device_kind)
    return {
        'device_kind': hw.device_kind,
        'devices': hw.detail,
        'strategy': hw.strategy_name,
        'num_replicas': hw.num_replicas,
        'num_workers': hw.num_workers,
        'policy': self.policy,
        'policy_reason': self.policy_reason,
        'loss_scaling': precision.needs_loss_scaling(self.policy,
                                                     hw.device_kind),
        'graph_rewrite': (precision.graph_rewrite_reason(hw.device_kind)
                          if self.policy == precision.REWRITE else None),
        'xla': self.xla,
        'xla_reason': self.xla_reason,
        'global_batch_size': config.global_batch_size,
        'per_replica_batch_size': per_replica,
        'steps_per_execution': steps,
        'steps_per_execution_reason': steps_reason,
        'workdir': self.workdir,
    }


def choose_xla(requested, hardware, policy=None):
  """Returns (on, reason) for --xla=auto|on|off on this hardware."""
  if policy == precision.REWRITE:
    precision.graph_rewrite_dtype(hardware.device_kind)  # Refuses a TPU.
    # Grappler, which does the rewrite, never sees a function XLA compiles.
    if requested == 'on':
      raise UserError('--xla=on cannot be combined with --policy=rewrite: '
                      "TensorFlow's mixed precision rewrite does not run on "
                      'XLA-compiled functions; use --xla=auto or off, or a '
                      'mixed_* policy with XLA')
    return False, ('--policy=rewrite: the graph rewrite does not run on '
                   'XLA-compiled functions')
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


# Steps per execution when the config leaves it at 0. Each execution is one
# host round trip: on a TPU that is a launch of a whole XLA program (over the
# network on a TPU Node) for steps of a few milliseconds, so it takes many
# steps to hide; tensorflow/tpu's EfficientNet ran an epoch per loop
# (iterations_per_loop). On CPU and GPU a call costs far less than a step and
# 8 only trims Python overhead; more would delay logs and preemption saves.
_AUTO_STEPS_PER_EXECUTION = {'TPU': 100, 'GPU': 8, 'CPU': 8}


def choose_steps_per_execution(requested, device_kind):
  """Returns (steps, reason): `requested` if 1 or more, 0 picks per device."""
  if requested < 0:
    raise UserError(f'steps_per_execution={requested} must be 1 or more, or '
                    '0 to pick one for the device')
  if requested:
    return requested, 'set in the config'
  return (_AUTO_STEPS_PER_EXECUTION[device_kind],
          f'auto for {device_kind}: 100 on TPU, 8 on CPU and GPU')


def validate(config, hardware):
  """Raises a one-line UserError for config values that cannot run."""
  replicas = hardware.num_replicas
  if config.global_batch_size < 1 or config.global_batch_size % replicas:
    raise UserError(f'global_batch_size={config.global_batch_size} does not '
                    f'split over {replicas} replicas; use a multiple of '
                    f'{replicas}')
  choose_steps_per_execution(config.steps_per_execution, hardware.device_kind)
  for key in ('epochs', 'log_every_steps',
              'checkpoint_every_steps', 'keep_checkpoints'):
    if config[key] < 1:
      raise UserError(f'{key}={config[key]} must be 1 or more')
  if config.model not in models.MODELS:
    raise UserError(f'unknown model {config.model!r}; accepted: '
                    f'{", ".join(models.MODELS)}')
  data.validate(config)


def _check_same_run(workdir, config):
  saved = workdir.read_json('run.json')
  if not saved:
    return
  for key in _RUN_IDENTITY:
    if saved['config'].get(key) != config[key]:
      raise UserError(
          f'workdir {workdir.url!r} holds a run with {key}='
          f'{saved["config"].get(key)!r}, not {config[key]!r}; use another '
          '--workdir to start a new run')


def _log_plan(summary):
  logging.info('Run: %s (%s) with %s, %d replica(s) over %d worker(s)',
               summary['device_kind'], summary['devices'],
               summary['strategy'], summary['num_replicas'],
               summary['num_workers'])
  logging.info('Precision: %s (%s%s); loss scaling %s', summary['policy'],
               summary['policy_reason'],
               f'; {summary["graph_rewrite"]}' if summary['graph_rewrite']
               else '', 'on' if summary['loss_scaling'] else 'off')
  logging.info('XLA: %s (%s)', 'on' if summary['xla'] else 'off',
               summary['xla_reason'])
  logging.info('Batch: %d global, %d per replica; %d steps per execution '
               '(%s)', summary['global_batch_size'],
               summary['per_replica_batch_size'],
               summary['steps_per_execution'],
               summary['steps_per_execution_reason'])
  logging.info('Workdir: %s', summary['workdir'])


def _writers(workdir, is_chief):
  if not is_chief:
    return tf.summary.create_noop_writer(), tf.summary.create_noop_writer()
  root = workdir.path('tensorboard')
  return (tf.summary.create_file_writer(os.path.join(root, 'train')),
          tf.summary.create_file_writer(os.path.join(root, 'eval')))


def _export(model, workdir, is_chief):
  """Saves a float32-probability SavedModel to <workdir>/export, atomically."""
  target = workdir.path('export')
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  models.with_softmax(model).export(staging, verbose=False)
  if not is_chief:
    tf.io.gfile.rmtree(staging)
    return None
  storage.replace_dir(staging, target)
  workdir.publish('export')
  return f'{workdir.url}/export'


@dataclasses.dataclass
class Trainer:
  """Model, optimizer and compiled steps, built inside the strategy scope."""
  model: keras.Model
  optimizer: keras.optimizers.Optimizer
  step: tf.Variable  # Every step taken; optimizer.iterations: those applied.
  train_fn: object
  eval_fn: object

  @property
  def skipped_steps(self):
    return int(self.step.numpy()) - int(self.optimizer.iterations.numpy())

  @property
  def loss_scale(self):
    if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      return float(self.optimizer.dynamic_scale.numpy())
    return None


def build_trainer(config, plan, num_classes, total_steps, steps_per_epoch):
  """Sets the policy and seed, then builds everything in the strategy scope."""
  strategy = plan.hardware.strategy
  device_kind = plan.hardware.device_kind
  keras.mixed_precision.set_global_policy(precision.keras_policy(plan.policy))
  if plan.policy == precision.REWRITE:
    # Before anything is traced: grappler rewrites functions as they run.
    dtype = precision.enable_graph_rewrite(device_kind)
    logging.info('Graph rewrite: eligible ops compute in %s', dtype)
  keras.utils.set_random_seed(config.seed)
  with strategy.scope():
    model = models.build_model(config.model, num_classes, config.image_size,
                               config.dropout_rate, config.batch_norm_momentum)
    optimizer = precision.wrap_optimizer(
        steps_lib.make_optimizer(config, config.global_batch_size, total_steps,
                                 steps_per_epoch), plan.policy, device_kind)
    # Built now, so a checkpoint restores into existing slots.
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name='step',
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  train_fn = steps_lib.make_train_function(
      model, optimizer, strategy, config.global_batch_size, num_classes,
      config.label_smoothing, step,
      jit_compile=plan.xla and plan.hardware.device_kind != 'TPU')
  eval_fn = steps_lib.make_eval_function(model, strategy, num_classes)
  return Trainer(model, optimizer, step, train_fn, eval_fn)


class Meter:
  """Throughput and input wait, over a window and over the whole run.

  The first execution traces and compiles; it is timed apart and never
  counted in throughput.
  """

  def __init__(self, global_batch_size):
    self.global_batch_size = global_batch_size
    self.compile_s = None
    self.total = [0, 0.0, 0.0]  # steps, seconds, input wait seconds
    self.window = [0, 0.0, 0.0]

  def add(self, steps, seconds, wait_s):
    if self.compile_s is None:
      self.compile_s = seconds
      return
    for totals in (self.total, self.window):
      totals[0] += steps
      totals[1] += seconds
      totals[2] += wait_s

  @staticmethod
  def _rates(steps, seconds, wait_s, batch):
    if not seconds:
      return None, None
    return steps * batch / seconds, wait_s / seconds

  def take_window(self):
    """(images/s, input wait fraction) since the last call."""
    rates = self._rates(*self.window, self.global_batch_size)
    self.window = [0, 0.0, 0.0]
    return rates

  def overall(self):
    return self._rates(*self.total, self.global_batch_size)


def epoch_steps(examples_per_epoch, num_train_examples, global_batch_size):
  """Steps per epoch: examples_per_epoch (0: the training set) / batch.

  An explicit examples_per_epoch must be whole global batches, so runs with
  different batches (launch.compare) see exactly the same number of examples.
  """
  if examples_per_epoch < 0 or examples_per_epoch % global_batch_size:
    raise UserError(f'examples_per_epoch={examples_per_epoch} must be 0 (the '
                    'training set) or a multiple of global_batch_size='
                    f'{global_batch_size}')
  steps = (examples_per_epoch or num_train_examples) // global_batch_size
  if steps < 1:
    raise UserError(f'global_batch_size={global_batch_size} is larger than '
                    f'the {num_train_examples} training examples')
  return steps


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What a run resolved before building any model: checked and printed."""
  workdir: storage.Workdir
  source: data.Source
  steps_per_epoch: int
  total_steps: int
  summary: dict


def prepare(config, plan):
  """Checks everything a run needs, short of building the model.

  Config values, workdir access (the bucket preflight for gs://), the data
  source and its size, the cache and the batch split; prints the resolved
  run. Shared by training and --dry_run, so a dry run checks what a run would.
  """
  hardware = plan.hardware
  validate(config, hardware)
  if hardware.tpu_workers_remote:
    storage.check_remote_tpu_paths(config, plan.workdir)
  workdir = storage.Workdir(plan.workdir, plan.staging_dir)
  if hardware.is_chief:
    workdir.check()  # For gs://: bucket exists and takes a write, or one line.
    _check_same_run(workdir, config)
  source = data.load_source(config)
  data.check_cache_fits(config, source)
  global_batch = config.global_batch_size
  steps_per_epoch = epoch_steps(config.get('examples_per_epoch', 0),
                                source.num_train_examples, global_batch)
  total_steps = config.epochs * steps_per_epoch
  summary = plan.summary(config)
  summary.update(dataset=source.name, train_examples=source.num_train_examples,
                 eval_examples=source.num_eval_examples,
                 num_classes=source.num_classes, total_steps=total_steps,
                 peak_learning_rate=config.base_learning_rate * global_batch /
                 256)
  _log_plan(summary)
  logging.info('Data: %s, %d classes, %d train / %d eval examples; %d steps '
               '(%d epochs of %d); peak learning rate %.3g = base %g x %d '
               'global / 256', source.name,
               source.num_classes, source.num_train_examples,
               source.num_eval_examples, total_steps, config.epochs,
               steps_per_epoch, summary['peak_learning_rate'],
               config.base_learning_rate, global_batch)
  return Prepared(workdir, source, steps_per_epoch, total_steps, summary)


def train_and_evaluate(config, plan):
  """Runs training to `config.epochs`, resuming if the workdir has a checkpoint."""
  hardware = plan.hardware
  strategy = hardware.strategy
  prepared = prepare(config, plan)
  workdir, source = prepared.workdir, prepared.source
  steps_per_epoch, total_steps = prepared.steps_per_epoch, prepared.total_steps
  global_batch = config.global_batch_size
  if hardware.is_chief:
    workdir.write_json('run.json', {'resolved': prepared.summary,
                                    'config': config.to_dict()})

  trainer = build_trainer(config, plan, source.num_classes, total_steps,
                          steps_per_epoch)
  # Before restoring: the seed's weights, equal across policies and batches.
  initial_weights_sha256 = _weights_digest(trainer.model)
  checkpointer = Checkpointer(
      workdir, config.keep_checkpoints, hardware.is_chief,
      io_device='/job:localhost' if hardware.tpu_workers_remote else None,
      model=trainer.model, optimizer=trainer.optimizer, step=trainer.step)
  checkpointer.restore_latest()
  initial_step = int(trainer.step.numpy())

  skips = data.SkipCounter()
  train_data = strategy.distribute_datasets_from_function(
      data.train_input_fn(config, source, global_batch, skips))
  eval_data = strategy.distribute_datasets_from_function(
      data.eval_input_fn(config, source, global_batch, skips))
  num_eval_steps = data.eval_steps(source, global_batch)
  train_writer, eval_writer = _writers(workdir, hardware.is_chief)

  def evaluate(at_step):
    result = {k: float(v) for k, v in
              _run(trainer.eval_fn, iter(eval_data), num_eval_steps,
                   config, source.num_classes).items()}
    logging.info('Eval at step %d: accuracy %.4f, loss %.4f over %d examples',
                 at_step, result['accuracy'], result['loss'],
                 result['examples'])
    with eval_writer.as_default(step=at_step):
      tf.summary.scalar('accuracy', result['accuracy'])
      tf.summary.scalar('loss', result['loss'])
    return result

  if initial_step:
    logging.info('Resuming at step %d of %d', initial_step, total_steps)
  preemption = _SigtermFlag()
  iterator = iter(train_data)
  meter = Meter(global_batch)
  warned_input_bound = False
  current = initial_step
  steps_per_execution = plan.steps_per_execution(config)
  while current < total_steps:
    num_steps = min(steps_per_execution, total_steps - current)
    start = time.perf_counter()
    out = {k: float(v) for k, v in
           _run(trainer.train_fn, iterator, num_steps, config,
                source.num_classes).items()}
    meter.add(num_steps, time.perf_counter() - start, out['input_wait_s'])
    previous, current = current, current + num_steps
    if previous == initial_step:
      logging.info('First execution (tracing and compiling included): %.1f s',
                   meter.compile_s)
    if not np.isfinite(out['loss']) and trainer.loss_scale is None:
      raise FloatingPointError(f'training loss is {out["loss"]} at step '
                               f'{current}')

    if _crossed(previous, current, config.log_every_steps) or \
        current == total_steps:
      rate, wait = meter.take_window()
      lr = float(trainer.optimizer.learning_rate)
      loss_scale = trainer.loss_scale
      logging.info(
          'step %d/%d (epoch %.1f): loss %.4f, accuracy %.3f, lr %.2e, '
          '%s img/s, input wait %s%s%s', current, total_steps,
          current / steps_per_epoch, out['loss'], out['accuracy'], lr,
          f'{rate:.0f}' if rate else '-',
          f'{wait:.0%}' if wait is not None else '-',
          f', loss scale {loss_scale:g}, skipped steps '
          f'{trainer.skipped_steps}' if loss_scale is not None else '',
          f', skipped records {skips.count}' if skips.count else '')
      if wait is not None and wait > 0.10 and not warned_input_bound:
        logging.warning(
            'Input-bound: training waited for data %.0f%% of the time; '
            'see BUILD_NOTES.md "Input pipeline" for what helps.', 100 * wait)
        warned_input_bound = True
      with train_writer.as_default(step=current):
        tf.summary.scalar('loss', out['loss'])
        tf.summary.scalar('accuracy', out['accuracy'])
        tf.summary.scalar('learning_rate', lr)
        if rate:
          tf.summary.scalar('images_per_sec', rate)
          tf.summary.scalar('input_wait_fraction', wait)
        tf.summary.scalar('skipped_records', skips.count)
        if loss_scale is not None:
          tf.summary.scalar('loss_scale', loss_scale)
          tf.summary.scalar('skipped_steps', trainer.skipped_steps)

    if preemption.raised:
      checkpointer.save(current)
      checkpointer.wait()
      workdir.publish('tensorboard')
      raise Preempted(f'SIGTERM: checkpoint of step {current} committed to '
                      f'{workdir.url}; rerun the same command to resume')
    if _crossed(previous, current, config.checkpoint_every_steps) or \
        current == total_steps:
      checkpointer.save(current)
      with train_writer.as_default(step=current):
        tf.summary.scalar('checkpoint_blocked_s', checkpointer.blocked_s)
      workdir.publish('tensorboard')
    eval_interval = steps_per_epoch * config.eval_every_epochs
    if eval_interval and current < total_steps and \
        _crossed(previous, current, eval_interval):
      evaluate(current)

  final = evaluate(total_steps)
  checkpointer.wait()
  preemption.restore()
  export_dir = _export(trainer.model, workdir, hardware.is_chief)
  images_per_sec, wait_fraction = meter.overall()
  metrics = {
      'policy': plan.policy,
      'strategy': hardware.strategy_name,
      'num_replicas': hardware.num_replicas,
      'num_workers': hardware.num_workers,
      'device_kind': hardware.device_kind,
      'xla': plan.xla,
      'model': config.model,
      'dataset': source.name,
      'image_size': config.image_size,
      'global_batch_size': global_batch,
      'steps_per_execution': steps_per_execution,
      'initial_step': initial_step,
      'train_steps': total_steps - initial_step,
      'total_steps': total_steps,
      'compile_s': meter.compile_s,
      'train_images_per_sec': images_per_sec,
      'input_wait_fraction': wait_fraction,
      'skipped_records': skips.count,
      'skipped_steps': trainer.skipped_steps,
      'checkpoint_blocked_s': checkpointer.blocked_s,
      'final_loss_scale': trainer.loss_scale,
      'eval_accuracy': final['accuracy'],
      'eval_loss': final['loss'],
      'eval_examples': int(final['examples']),
      'export_dir': export_dir,
      'weights_sha256': _weights_digest(trainer.model),
      'initial_weights_sha256': initial_weights_sha256,
      'seed': config.seed,
      'epochs': config.epochs,
      'steps_per_epoch': steps_per_epoch,
      'examples_per_epoch': steps_per_epoch * global_batch,
      **peak_memory(hardware.device_kind),
  }
  if hardware.is_chief:
    eval_writer.flush()
    workdir.publish('tensorboard')
    workdir.write_json('metrics.json', metrics)
  logging.info('Done: eval_accuracy %.4f, %s img/s, input wait %s, weights '
               'sha256 %s; metrics in %s', final['accuracy'],
               f'{images_per_sec:.0f}' if images_per_sec else '-',
               f'{wait_fraction:.0%}' if wait_fraction is not None else '-',
               metrics['weights_sha256'][:16], f'{workdir.url}/metrics.json')
  return metrics


class _SigtermFlag:
  """Turns SIGTERM (what cloud preemption sends) into a flag the loop reads.

  The loop then saves at the next step boundary, waits for the upload and
  stops; a second SIGTERM gets the default behaviour.
  """

  def __init__(self):
    self.raised = False
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del frame
    logging.warning('SIGTERM: saving a checkpoint at the next step boundary')
    self.raised = True
    signal.signal(signum, self._previous or signal.SIG_DFL)

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def peak_memory(device_kind):
  """This process's peak memory: the accelerator's, else the host's RSS."""
  if device_kind in ('GPU', 'TPU'):
    try:
      info = tf.config.experimental.get_memory_info(f'{device_kind}:0')
      return {'peak_memory_bytes': int(info['peak']),
              'peak_memory_kind': f'{device_kind}:0 device'}
    except (ValueError, tf.errors.OpError):
      pass  # Not tracked on this device: the host figure still says something.
  # ru_maxrss is in KiB on Linux.
  rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return {'peak_memory_bytes': rss_kib * 1024, 'peak_memory_kind': 'host RSS'}


def _weights_digest(model):
  """SHA-256 of every weight: equal digests mean workers hold equal models."""
  digest = hashlib.sha256()
  for weight in model.weights:
    digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
  return digest.hexdigest()


def _crossed(previous, current, interval):
  """True if a multiple of `interval` lies in (previous, current]."""
  return current // interval > previous // interval


_PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
              tf.errors.AbortedError, tf.errors.CancelledError)


def _run(function, iterator, num_steps, config, num_classes):
  """Calls a compiled multi-step function; bad labels become a UserError."""
  try:
    return function(iterator, tf.constant(num_steps))
  except _PEER_LOST as e:
    if 'TF_CONFIG' not in os.environ:
      raise
    raise UserError(
        f'another worker stopped or never answered ({type(e).__name__}: '
        f'{first_line(e)}); restart all workers with the same command '
        'to resume from the last checkpoint') from None
  except tf.errors.InvalidArgumentError as e:
    message = data.label_error(e, num_classes, config.label_offset)
    if message:
      raise UserError(message) from None
    raise
