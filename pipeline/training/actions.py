"""Periodic work of the training loop, one small action each.

After every compiled execution the loop hands an `Execution` to each action
in turn; an action decides from it whether its time has come (an interval
crossed, the last step) and does its work: recover from divergence, save a
checkpoint, evaluate, profile (here), report progress (progress.py), save
on preemption (preemption.py). A new kind of
periodic work is one more callable in the list `train.train_and_evaluate`
builds; the loop itself does not change. An action that restores an earlier
step raises RolledBack: the actions after it skip that execution.
"""

import dataclasses
import math
import os

from absl import logging
import tensorflow as tf

from pipeline.run import console
from pipeline.errors import UserError
from pipeline.rules.config import validation
from pipeline.storage import workdirs


@dataclasses.dataclass(frozen=True)
class Execution:
  """What one compiled call of the loop did, as every action sees it."""
  first_step: int  # The step count before the call.
  step: int  # The step count after it.
  total_steps: int
  seconds: float  # Wall time of the call, input waits included.
  outputs: dict  # Floats: mean 'loss', 'accuracy', 'grad_norm'; 'input_wait_s'.
  # It traced and compiled the step anew (the run's first execution, a
  # stage's new size): its time is no measure of the step's.
  compiled: bool = False

  @property
  def num_steps(self):
    return self.step - self.first_step

  @property
  def is_last(self):
    return self.step == self.total_steps

  def crossed(self, interval):
    """True if a multiple of `interval` lies in (first_step, step]."""
    return bool(interval) and self.step // interval > self.first_step // interval


class Scalars:
  """One split's curves ('train', 'eval'): TensorBoard's writer, and the
  run's trackers (tracking.py) under '<split>/<name>'."""

  def __init__(self, writer, split, tracking=None):
    self.writer, self.split, self.tracking = writer, split, tracking

  def write(self, step, values):
    """{name: float} at `step`."""
    with self.writer.as_default(step=step):
      for name, value in values.items():
        tf.summary.scalar(name, value)
    if self.tracking:
      self.tracking.log(step, {f'{self.split}/{name}': float(value)
                               for name, value in values.items()})

  def as_default(self, step):
    return self.writer.as_default(step=step)

  def flush(self):
    self.writer.flush()


def summary_writers(workdir, is_chief, tracking=None):
  """Scalars of (train, eval): TensorBoard's files (only the chief writes
  them) and `tracking`'s runs."""
  if not is_chief:
    return (Scalars(tf.summary.create_noop_writer(), 'train'),
            Scalars(tf.summary.create_noop_writer(), 'eval'))
  root = workdir.path('tensorboard')
  return tuple(Scalars(tf.summary.create_file_writer(os.path.join(root, split)),
                       split, tracking) for split in ('train', 'eval'))


class RecordRun:
  """Writes run.json after the first execution: the recipe the workdir's
  checkpoints were trained under, and the changes it accepted, recorded
  once a step has trained under them."""

  def __init__(self, workdir, record):
    self.workdir, self.record = workdir, record

  def __call__(self, execution):
    if self.record is not None:
      self.workdir.write_json(workdirs.File.RUN, self.record)
      self.record = None


class Profile:
  """A profiler trace of the executions covering steps [start, stop), into
  the TensorBoard folder (plugins/profile/...), by the backend's profiler
  (`start_trace(logdir)`, `stop_trace()`): TensorFlow's and JAX's write the
  same XPlane files for the same Profile tab.

  An action runs after an execution, so tracing starts at the boundary
  before the execution that reaches `start` (at once if the run starts
  there) and stops at the first boundary at or past `stop`.
  """

  def __init__(self, start, stop, logdir, steps_per_execution, initial_step,
               start_trace, stop_trace):
    self.start, self.stop = start, stop
    self.logdir = logdir
    self._start, self._stop = start_trace, stop_trace
    self.steps_per_execution = steps_per_execution
    self.tracing = False
    self.done = initial_step >= stop
    if not self.done and initial_step + steps_per_execution > start:
      self._begin(initial_step)

  def _begin(self, step):
    self._start(self.logdir)
    self.tracing = True
    logging.info('Profiling from step %d (profile_steps %d,%d)', step,
                 self.start, self.stop)

  def __call__(self, execution):
    if self.done:
      return
    if self.tracing and execution.step >= self.stop:
      self.close()
      logging.info('Profiled steps %d to %d: the trace is in TensorBoard\'s '
                   'profile tab (%s)', self.start, execution.step, self.logdir)
    elif (not self.tracing and
          execution.step + self.steps_per_execution > self.start):
      self._begin(execution.step)

  def close(self):
    if self.tracing:
      self._stop()
      self.tracing = False
      self.done = True


class RolledBack(Exception):
  """An action restored an earlier step; the loop goes on from `step`."""

  def __init__(self, step):
    super().__init__(f'rolled back to step {step}')
    self.step = step


class RecoverFromDivergence:
  """Rolls a diverged run back to its newest checkpoint, a few times at most.

  As TF Model Garden's RecoveryAction does: a non-finite loss (float32,
  bfloat16), or under float16 a loss scale below 1 or `max_skipped` executions
  in a row whose every step the loss scale skipped, restores the newest
  checkpoint this process saved (every worker saved the same step) and goes
  on with the next input. After `max_trials` recoveries, one line names the
  step. Under float16 an overflow alone is no divergence: the loss scale
  skips that step and lowers itself.
  """

  def __init__(self, trainer, checkpointer, max_trials, max_skipped):
    self.trainer = trainer
    self.checkpointer = checkpointer
    self.max_trials = max_trials
    self.max_skipped = max_skipped
    self.trials = 0
    self._reset()

  def _reset(self):
    self._skipped_steps = self.trainer.skipped_steps
    self._skipped_in_a_row = 0

  def __call__(self, execution):
    problem = self._problem(execution)
    if not problem:
      return
    where = f'training diverged at step {execution.step} ({problem})'
    if self.trials >= self.max_trials:
      raise UserError(f'{where} after {self.trials} recoveries '
                      f'(recovery_max_trials={self.max_trials}); lower '
                      '--config.base_learning_rate or raise '
                      '--config.warmup_epochs')
    step = self.checkpointer.restore_last_saved()
    if step is None:
      raise UserError(f'{where} before its first checkpoint, so there is '
                      'nothing to roll back to; lower '
                      '--config.base_learning_rate or raise '
                      '--config.warmup_epochs')
    self.trials += 1
    self._reset()
    logging.warning('%s: restored the checkpoint of step %d and going on with '
                    'the next input (recovery %d of at most %d)', where, step,
                    self.trials, self.max_trials)
    raise RolledBack(step)

  def _problem(self, execution):
    """What makes this execution diverged, or None."""
    loss_scale = self.trainer.loss_scale
    if loss_scale is None:
      loss = execution.outputs['loss']
      return None if math.isfinite(loss) else f'loss {loss}'
    skipped = self.trainer.skipped_steps
    all_skipped = skipped - self._skipped_steps >= execution.num_steps
    self._skipped_steps = skipped
    self._skipped_in_a_row = self._skipped_in_a_row + 1 if all_skipped else 0
    if loss_scale < 1:
      return f'loss scale {loss_scale:g} fell below 1'
    if self._skipped_in_a_row >= self.max_skipped:
      return (f'every step of {self._skipped_in_a_row} executions in a row was '
              'skipped for non-finite gradients')
    return None


class SaveCheckpoints:
  """A checkpoint at every multiple of `every_steps`, and at the last step."""

  def __init__(self, checkpointer, every_steps, writer, workdir):
    self.checkpointer = checkpointer
    self.every_steps = every_steps
    self.writer = writer
    self.workdir = workdir

  def __call__(self, execution):
    if not (execution.crossed(self.every_steps) or execution.is_last):
      return
    self.checkpointer.save(execution.step)
    self.writer.write(execution.step, {
        'checkpoint_blocked_s': self.checkpointer.blocked_s})
    self.workdir.publish('tensorboard')
    # With each checkpoint: a killed run's log reaches the bucket too.
    self.workdir.publish(console.LOG_FILE)


class Evaluate:
  """Evaluation on the held-out set every `every_steps` steps.

  The final evaluation is the run's own (train.train_and_evaluate calls
  `run` after the loop), so the last step is not evaluated here.
  """

  def __init__(self, trainer, dataset, num_steps, every_steps, writer,
               listeners=()):
    self.trainer = trainer
    self.dataset = dataset
    self.num_steps = num_steps
    self.every_steps = every_steps
    self.writer = writer
    self.listeners = listeners  # Called with (step, result) after each.

  def __call__(self, execution):
    if execution.crossed(self.every_steps) and not execution.is_last:
      self.run(execution.step)

  def run(self, step):
    """Evaluates the current weights (and their moving average, if kept);
    returns Trainer.evaluate's result."""
    result = self.trainer.evaluate(self.dataset, self.num_steps)
    top5 = self.trainer.num_classes > 5  # Else top-5 accuracy is always 1.
    averaged = 'accuracy_raw' in result
    logging.info('Eval at step %d: accuracy %.4f%s%s, loss %.4f over %d '
                 'examples', step, result['accuracy'],
                 f', top-5 {result["top5_accuracy"]:.4f}' if top5 else '',
                 f' (moving average; raw weights {result["accuracy_raw"]:.4f})'
                 if averaged else '', result['loss'], result['examples'])
    keys = ['accuracy', 'loss'] + (['top5_accuracy'] if top5 else [])
    self.writer.write(step, {key: result[key] for key in
                             keys + [f'{key}_raw' for key in keys if averaged]})
    for listener in self.listeners:
      listener(step, result)
    return result


class KeepBest:
  """Keeps the checkpoint with the best eval metric as a series of its own.

  `checkpointer` is a Checkpointer of the 'checkpoints_best' series keeping
  one: the rolling series' pruning never touches it. The best value so far
  lives in best_checkpoint.json in the workdir, so a resumed run compares
  with it.
  """

  RECORD = workdirs.File.BEST

  def __init__(self, metric, checkpointer, workdir, is_chief):
    self.metric = validation.Metric(metric)
    self.checkpointer = checkpointer
    self.workdir = workdir
    self.is_chief = is_chief
    # Every worker reads it: all must decide alike (they all join a save).
    self.best = workdir.read_json(self.RECORD)

  def _better(self, value):
    if self.best is None:
      return True
    if self.metric is validation.Metric.EVAL_LOSS:
      return value < self.best['value']
    return value > self.best['value']

  def __call__(self, step, result):
    value = result[self.metric[len('eval_'):]]
    # Every worker takes part in the save (tf.distribute needs them all);
    # they agree, since the eval result is reduced across all of them.
    if not self._better(value):
      return
    self.checkpointer.save(step)
    self.best = {'metric': self.metric, 'value': value, 'step': step}
    if self.is_chief:
      self.checkpointer.wait()  # The record never names an uncommitted one.
      self.workdir.write_json(self.RECORD, self.best)
    logging.info('Best %s so far: %.4f at step %d (kept in checkpoints_best)',
                 self.metric, value, step)

  def metrics(self):
    """metrics.json's keys for the best checkpoint."""
    return {'best_metric': self.metric, 'best_step': self.best['step'],
            'best_value': self.best['value']}
