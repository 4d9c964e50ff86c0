"""Periodic work of the training loop, one small action each.

After every compiled execution the loop hands an `Execution` to each action
in turn; an action decides from it whether its time has come (an interval
crossed, the last step) and does its work: report progress, stop on a
non-finite loss, save on preemption, save a checkpoint, evaluate. A new kind
of periodic work is one more callable in the list `train.train_and_evaluate`
builds; the loop itself does not change.
"""

import dataclasses
import math
import os
import signal
import threading

import tensorflow as tf
from absl import logging

from pipeline.errors import Preempted

# Above this fraction of time waiting for input, the run says it is input-bound.
INPUT_BOUND_FRACTION = 0.10


@dataclasses.dataclass(frozen=True)
class Execution:
  """What one compiled call of the loop did, as every action sees it."""
  first_step: int  # The step count before the call.
  step: int  # The step count after it.
  total_steps: int
  seconds: float  # Wall time of the call, input waits included.
  outputs: dict  # Floats: mean 'loss' and 'accuracy', 'input_wait_s'.

  @property
  def num_steps(self):
    return self.step - self.first_step

  @property
  def is_last(self):
    return self.step == self.total_steps

  def crossed(self, interval):
    """True if a multiple of `interval` lies in (first_step, step]."""
    return bool(interval) and self.step // interval > self.first_step // interval


def summary_writers(workdir, is_chief):
  """TensorBoard writers (train, eval); only the chief writes files."""
  if not is_chief:
    return tf.summary.create_noop_writer(), tf.summary.create_noop_writer()
  root = workdir.path('tensorboard')
  return (tf.summary.create_file_writer(os.path.join(root, 'train')),
          tf.summary.create_file_writer(os.path.join(root, 'eval')))


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

  def _rates(self, steps, seconds, wait_s):
    if not seconds:
      return None, None
    return steps * self.global_batch_size / seconds, wait_s / seconds

  def take_window(self):
    """(images/s, input wait fraction) since the last call."""
    rates = self._rates(*self.window)
    self.window = [0, 0.0, 0.0]
    return rates

  def overall(self):
    """(images/s, input wait fraction) over the run, compile excluded."""
    return self._rates(*self.total)


class ReportProgress:
  """Progress lines and TensorBoard scalars every `every_steps` steps.

  Owns the meter, and warns once when the run waits for input more than
  INPUT_BOUND_FRACTION of the time.
  """

  def __init__(self, trainer, plan, every_steps, writer, skips):
    self.trainer = trainer
    self.steps_per_epoch = plan.steps_per_epoch
    self.every_steps = every_steps
    self.writer = writer
    self.skips = skips
    self.meter = Meter(plan.global_batch_size)
    self._warned_input_bound = False

  def __call__(self, execution):
    first = self.meter.compile_s is None
    self.meter.add(execution.num_steps, execution.seconds,
                   execution.outputs['input_wait_s'])
    if first:
      logging.info('First execution (tracing and compiling included): %.1f s',
                   self.meter.compile_s)
    if execution.crossed(self.every_steps) or execution.is_last:
      self._report(execution)

  def _report(self, execution):
    out, trainer = execution.outputs, self.trainer
    rate, wait = self.meter.take_window()
    lr = trainer.learning_rate()
    loss_scale = trainer.loss_scale
    logging.info(
        'step %d/%d (epoch %.1f): loss %.4f, accuracy %.3f, lr %.2e, '
        '%s img/s, input wait %s%s%s', execution.step, execution.total_steps,
        execution.step / self.steps_per_epoch, out['loss'], out['accuracy'],
        lr, f'{rate:.0f}' if rate else '-',
        f'{wait:.0%}' if wait is not None else '-',
        f', loss scale {loss_scale:g}, skipped steps '
        f'{trainer.skipped_steps}' if loss_scale is not None else '',
        f', skipped records {self.skips.count}' if self.skips.count else '')
    if (wait is not None and wait > INPUT_BOUND_FRACTION and
        not self._warned_input_bound):
      logging.warning(
          'Input-bound: training waited for data %.0f%% of the time; '
          'see BUILD_NOTES.md "Input pipeline" for what helps.', 100 * wait)
      self._warned_input_bound = True
    with self.writer.as_default(step=execution.step):
      tf.summary.scalar('loss', out['loss'])
      tf.summary.scalar('accuracy', out['accuracy'])
      tf.summary.scalar('learning_rate', lr)
      if rate:
        tf.summary.scalar('images_per_sec', rate)
        tf.summary.scalar('input_wait_fraction', wait)
      tf.summary.scalar('skipped_records', self.skips.count)
      if loss_scale is not None:
        tf.summary.scalar('loss_scale', loss_scale)
        tf.summary.scalar('skipped_steps', trainer.skipped_steps)


class StopOnNonFiniteLoss:
  """Stops a float32 or bfloat16 run whose loss became NaN or inf.

  Under float16 the loss scale absorbs overflow: it skips the step and
  lowers the scale, so a non-finite loss there is not the end of the run.
  """

  def __init__(self, trainer):
    self.trainer = trainer

  def __call__(self, execution):
    loss = execution.outputs['loss']
    if not math.isfinite(loss) and self.trainer.loss_scale is None:
      raise FloatingPointError(f'training loss is {loss} at step '
                               f'{execution.step}')


class SaveOnPreemption:
  """Turns SIGTERM (what cloud preemption sends) into a save and a stop.

  The signal only sets a flag; at the next execution boundary the action
  saves, waits for the checkpoint's commit and raises Preempted. A second
  SIGTERM gets the previous handler. close() puts that handler back.
  """

  def __init__(self, checkpointer, workdir):
    self.checkpointer = checkpointer
    self.workdir = workdir
    self.raised = False
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del frame
    logging.warning('SIGTERM: saving a checkpoint at the next step boundary')
    self.raised = True
    signal.signal(signum, self._previous or signal.SIG_DFL)

  def __call__(self, execution):
    if not self.raised:
      return
    self.checkpointer.save(execution.step)
    self.checkpointer.wait()
    self.workdir.publish('tensorboard')
    raise Preempted(f'SIGTERM: checkpoint of step {execution.step} committed '
                    f'to {self.workdir.url}; rerun the same command to resume')

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


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
    with self.writer.as_default(step=execution.step):
      tf.summary.scalar('checkpoint_blocked_s', self.checkpointer.blocked_s)
    self.workdir.publish('tensorboard')


class Evaluate:
  """Evaluation on the held-out set every `every_steps` steps.

  The final evaluation is the run's own (train.train_and_evaluate calls
  `run` after the loop), so the last step is not evaluated here.
  """

  def __init__(self, trainer, dataset, num_steps, every_steps, writer):
    self.trainer = trainer
    self.dataset = dataset
    self.num_steps = num_steps
    self.every_steps = every_steps
    self.writer = writer

  def __call__(self, execution):
    if execution.crossed(self.every_steps) and not execution.is_last:
      self.run(execution.step)

  def run(self, step):
    """Evaluates the current weights; returns loss, accuracy and examples."""
    result = self.trainer.evaluate(iter(self.dataset), self.num_steps)
    logging.info('Eval at step %d: accuracy %.4f, loss %.4f over %d examples',
                 step, result['accuracy'], result['loss'], result['examples'])
    with self.writer.as_default(step=step):
      tf.summary.scalar('accuracy', result['accuracy'])
      tf.summary.scalar('loss', result['loss'])
    return result
