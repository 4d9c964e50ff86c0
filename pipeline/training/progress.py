"""Progress of a run: throughput, input wait, the console line and curves.

ReportProgress is a periodic action (pipeline/training/actions.py has the interface):
after every execution it adds to the meter and the loss curve; every
`log_every_steps` it prints the progress line (with the gradient's norm
and the time left to the run's end and to its next evaluation) and writes
TensorBoard scalars, and warns once when the run is input-bound. Between
lines, a live bar on terminals.
"""

from absl import logging

from pipeline.recipe import progressive
from pipeline.rules.speed import saved_rate
from pipeline.run import console

# Above this fraction of time waiting for input, the run says it is input-bound.
INPUT_BOUND_FRACTION = 0.10
# Points of the training-loss curve in TensorBoard, whatever the run length.
CURVE_POINTS = 200


class Meter:
  """Throughput and input wait, over a window and over the whole run.

  The first execution traces and compiles, as does a stage's first at a
  new size (progressive learning); they are timed apart and never counted
  in throughput.
  """

  def __init__(self, global_batch_size):
    self.global_batch_size = global_batch_size
    self.compile_s = None
    self.total = [0, 0.0, 0.0]  # steps, seconds, input wait seconds
    self.window = [0, 0.0, 0.0]

  def add(self, steps, seconds, wait_s, compiled=False):
    if self.compile_s is None or compiled:
      self.compile_s = (self.compile_s or 0.0) + seconds
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


class StepTimes:
  """The seconds a step takes in each stage of the run (progressive
  learning's stages, each at its own image size; one stage otherwise),
  compiling executions left out, to say how long the run has left.

  A stage not yet reached is estimated from the last one measured, scaled
  by its pixels: a step's convolutions grow with the image's area (its
  steps from 32 to 64 px cost 3.3x on efficientnet_tiny, 3.5x on B0, where
  the area is 4x). A progressive run's first stage would otherwise promise
  the run's end at its small images' speed, a third of the real time left.
  """

  def __init__(self, stages):
    self.stages = stages
    self.measured = {}  # stage index: [steps, seconds]

  def add(self, first_step, steps, seconds):
    """An execution's time (it runs within one stage: recipe/progressive)."""
    stage = progressive.stage_at(self.stages, first_step)
    totals = self.measured.setdefault(stage.index, [0, 0.0])
    totals[0] += steps
    totals[1] += seconds

  def _per_step(self, stage):
    if stage.index in self.measured:
      steps, seconds = self.measured[stage.index]
      return seconds / steps
    if not self.measured:
      return None
    known = self.stages[max(self.measured)]
    return (self._per_step(known) *
            (stage.image_size / known.image_size) ** 2)

  def seconds(self, start, end):
    """The estimated seconds of steps [start, end); None before a step is
    measured."""
    total = 0.0
    for stage in self.stages:
      steps = min(end, stage.end_step) - max(start, stage.first_step)
      if steps > 0:
        per_step = self._per_step(stage)
        if per_step is None:
          return None
        total += steps * per_step
    return total


def time_left(step, total_steps, eval_every_steps, seconds_of):
  """'4m 05s left, next eval in 1m 10s' from the steps' measured time
  (compile and evaluations left out): `seconds_of(start, end)`, the
  estimated seconds of steps [start, end) (StepTimes.seconds), None before
  the first measured step: then 'time left: estimating'. Without periodic
  evaluation the next is the last."""
  run_left = seconds_of(step, total_steps)
  if run_left is None:
    return 'time left: estimating'
  if step >= total_steps:
    return 'final eval next'
  next_eval = total_steps
  if eval_every_steps:
    next_eval = min((step // eval_every_steps + 1) * eval_every_steps,
                    total_steps)
  return (f'{console.duration(run_left)} left, next eval in '
          f'{console.duration(seconds_of(step, next_eval))}')


def curve_every(total_steps):
  """The step interval of the loss curve: at most CURVE_POINTS points (the
  multiples of it, and the last step)."""
  return max(1, -(-total_steps // CURVE_POINTS))


class ReportProgress:
  """Progress lines and TensorBoard scalars every `every_steps` steps.

  Owns the meter and the count of records the input skipped (it arrives
  with each execution's outputs), and warns once when the run waits for
  input more than INPUT_BOUND_FRACTION of the time.
  """

  def __init__(self, trainer, plan, every_steps, writer, mixed_labels=False,
               eval_every_steps=0):
    self.trainer = trainer
    # Mixup and CutMix blend two labels: a hit is the dominant one.
    self.accuracy_name = ('accuracy (dominant label)' if mixed_labels else
                          'accuracy')
    self.steps_per_epoch = plan.steps_per_epoch
    self.every_steps = every_steps
    self.eval_every_steps = eval_every_steps  # 0: only at the end.
    self.writer = writer
    self.skipped_records = 0
    self.meter = Meter(plan.global_batch_size)
    self.step_times = StepTimes(plan.stages)
    self._warned_input_bound = False
    self.saved_rate = plan.saved_rate
    self.compile_cache_dir = (plan.compile_cache.directory
                              if plan.compile_cache else '')
    self._bar = None  # console.live_bar on a terminal.
    self.curve_every = curve_every(plan.total_steps)

  def __call__(self, execution):
    first = self.meter.compile_s is None
    self.meter.add(execution.num_steps, execution.seconds,
                   execution.outputs['input_wait_s'], execution.compiled)
    if not (first or execution.compiled):
      self.step_times.add(execution.first_step, execution.num_steps,
                          execution.seconds)
    self.skipped_records += int(execution.outputs.get('skipped_records', 0))
    if first:
      logging.info('First execution (tracing and compiling included): %.1f s',
                   self.meter.compile_s)
    self._record_curve(execution)
    if execution.crossed(self.every_steps) or execution.is_last:
      console.close_bar(self._bar)
      self._bar = None
      self._report(execution)
    else:
      self._show(execution)

  def _record_curve(self, execution):
    """Training loss points every `curve_every` steps (each step's own loss
    comes back with the execution), so even a short run plots a curve of
    about CURVE_POINTS points; the console keeps its own interval."""
    losses = execution.outputs.get('step_losses')
    if losses is None:
      return
    for step in range(execution.first_step + 1, execution.step + 1):
      if step % self.curve_every == 0 or step == execution.total_steps:
        self.writer.write(step, {
            'loss': losses[step - execution.first_step - 1]})

  def _show(self, execution):
    """The live bar (terminals only) of the steps up to the next line."""
    if self._bar is None:
      stretch_end = min(
          (execution.first_step // self.every_steps + 1) * self.every_steps,
          execution.total_steps)
      start = stretch_end - self.every_steps
      self._bar = console.live_bar(stretch_end - max(start, 0),
                                   f'steps to {stretch_end}')
      if self._bar is None:
        return
      self._bar.update(execution.first_step - max(start, 0))
    self._bar.update(execution.num_steps)
    self._bar.set_postfix(loss=f'{execution.outputs["loss"]:.4f}',
                          refresh=False)

  def _report(self, execution):
    out, trainer = execution.outputs, self.trainer
    rate, wait = self.meter.take_window()
    lr = trainer.learning_rate()
    loss_scale = trainer.loss_scale
    logging.info(
        'step %d/%d (epoch %.1f): loss %.4f, %s %.3f, grad norm %.3g, '
        'lr %.2e, %s img/s, input wait %s%s%s; %s', execution.step,
        execution.total_steps, execution.step / self.steps_per_epoch,
        out['loss'], self.accuracy_name, out['accuracy'], out['grad_norm'],
        lr, f'{rate:.0f}' if rate else '-',
        f'{wait:.0%}' if wait is not None else '-',
        f', loss scale {loss_scale:g}, skipped steps '
        f'{trainer.skipped_steps}' if loss_scale is not None else '',
        f', skipped records {self.skipped_records}'
        if self.skipped_records else '',
        time_left(execution.step, execution.total_steps,
                  self.eval_every_steps, self.step_times.seconds))
    if (wait is not None and wait > INPUT_BOUND_FRACTION and
        not self._warned_input_bound):
      logging.warning(
          'Input-bound: training waited for data %.0f%% of the time; '
          'see BUILD_NOTES.md "Input pipeline" for what helps.', 100 * wait)
      self._warned_input_bound = True
    self._check_step_rate(rate, wait)
    scalars = {'accuracy': out['accuracy'], 'grad_norm': out['grad_norm'],
               'learning_rate': lr, 'skipped_records': self.skipped_records}
    if rate:
      scalars.update(images_per_sec=rate, input_wait_fraction=wait)
    if loss_scale is not None:
      scalars.update(loss_scale=loss_scale,
                     skipped_steps=trainer.skipped_steps)
    self.writer.write(execution.step, scalars)

  def _check_step_rate(self, rate, wait):
    """Warns once where the step, input waits left out, runs more than
    saved_rate.SLOW below the rate launch.probe saved for this card."""
    if not (self.saved_rate and rate and wait is not None and wait < 1):
      return
    line = saved_rate.slow_step_line(rate / (1 - wait), self.saved_rate,
                                     self.compile_cache_dir)
    if line:
      logging.warning('%s', line)
      self.saved_rate = None  # Once.
