"""Train and evaluate one resolved run, top to bottom.

train_and_evaluate(plan) builds the model on the plan's backend,
restores the newest checkpoint, runs compiled multi-step executions and
hands each to the periodic actions (progress, checkpoints, evaluation,
preemption), then evaluates, exports and writes metrics.json.
"""

import json
import time

from absl import logging
import tensorflow as tf

from pipeline.training import actions
from pipeline.run import console
from pipeline.data import inputs
from pipeline.reports import export
from pipeline.recipe import finetune
from pipeline.reports import metrics
from pipeline.training import preemption as preemption_lib
from pipeline.training import progress as progress_lib
from pipeline.training import stages
from pipeline.training import tracking as tracking_lib
from pipeline.rules.machine import stopping
from pipeline.storage import workdir_lock
from pipeline.storage.checkpoint import Checkpointer
from pipeline.storage import workdirs


def train_and_evaluate(plan, extra_actions=()):
  """Trains to the plan's last step, resuming from the workdir; returns metrics.

  `extra_actions` run before the built-in ones at every execution boundary
  (see pipeline/training/actions.py for the interface), so a test can inject a fault.
  """
  hardware, workdir = plan.hardware, plan.workdir
  log_file, hold = None, None
  if hardware.is_chief:
    # Before anything is written: a second run on this workdir stops here.
    hold = workdir_lock.WorkdirLock(workdir).acquire()
    workdir.fetch(console.LOG_FILE)  # Appended to, on a resume.
    log_file = console.log_to_file(workdir.path(console.LOG_FILE))
  try:
    return _train_and_evaluate(
        plan, [*extra_actions, *([_still_held(hold)] if hold else [])])
  finally:
    console.stop_logging_to(log_file)
    if log_file:
      workdir.publish(console.LOG_FILE)
    if hold:
      hold.release()


def _still_held(hold):
  """A periodic action: stop if another run took this one's lease over."""
  return lambda execution: hold.raise_if_lost()


def _train_and_evaluate(plan, extra_actions):
  started = time.perf_counter()
  config = plan.outputs
  hardware, workdir = plan.hardware, plan.workdir
  trainer = plan.backend.build_trainer(plan)
  # Before restoring: the seed's weights, equal across policies and batches.
  initial_weights_sha256 = trainer.weights_sha256()
  checkpointer, keep_best, initial_step = _resume(plan, trainer)

  backend, batch = plan.backend, plan.global_batch_size
  train_data = stages.StagedInput(plan, trainer, f'train:{workdir.url}')
  eval_data = backend.distribute(hardware, inputs.eval_input(plan))
  tracking = tracking_lib.Tracking.start(plan)
  train_writer, eval_writer = actions.summary_writers(
      workdir, hardware.is_chief, tracking)
  _write_plan_text(plan, train_writer, initial_step)
  eval_every_steps = plan.eval_every_steps
  progress = progress_lib.ReportProgress(
      trainer, plan, config.log_every_steps, train_writer,
      mixed_labels=plan.input.mixes, eval_every_steps=eval_every_steps)
  evaluate = actions.Evaluate(
      trainer, eval_data, inputs.eval_steps(plan.source, batch),
      eval_every_steps, eval_writer,
      listeners=[keep_best] if keep_best else [])
  save_on_stop = preemption_lib.SaveOnStop(
      checkpointer, workdir, sum_over_workers=(
          backend.sum_over_workers(hardware) if hardware.num_workers > 1
          else None))
  window = plan.profile_window
  profile = (actions.Profile(*window, workdir.path('tensorboard'),
                             plan.steps_per_execution, initial_step,
                             *backend.profiler())
             if window and hardware.is_chief else None)
  try:
    with stopping.armed(resume_hint='rerun the same command to resume from '
                        f'the last checkpoint committed to {workdir.url}'):
      run_loop(trainer, train_data, plan, initial_step, [
          # run.json once a step has trained under it: a run that stops
          # before (a bad init_from, a missing file) leaves no recipe.
          *([actions.RecordRun(workdir, plan.run_record())]
            if hardware.is_chief else []),
          *extra_actions,
          train_data.after_execution,
          *([profile] if profile else []),
          progress,
          actions.RecoverFromDivergence(
              trainer, checkpointer, config.recovery_max_trials,
              config.recovery_max_skipped_executions),
          save_on_stop,
          actions.SaveCheckpoints(checkpointer, config.checkpoint_every_steps,
                                  train_writer, workdir),
          evaluate,
      ])
    final_eval = evaluate.run(plan.total_steps)
    checkpointer.wait()
  finally:
    if profile:
      profile.close()

  result = metrics.run_metrics(
      plan, trainer, progress, final_eval, initial_step=initial_step,
      initial_weights_sha256=initial_weights_sha256,
      checkpoint_blocked_s=checkpointer.blocked_s,
      export_dir=config.export and export.export_run(plan, trainer) or None)
  if keep_best:  # Last: it loads the best weights into the model.
    keep_best.checkpointer.restore_latest()
    result.update(keep_best.metrics(), best_export_dir=(
        config.export and export.export_run(plan, trainer, 'export_best')
        or None))
  # Each size a program of its own (progressive learning), compiled once.
  result['train_programs_compiled'] = trainer.compiled_programs()
  # Building, compiling, training, evaluating and exporting: the run's time.
  result['wall_s'] = round(time.perf_counter() - started, 1)
  if hardware.is_chief:
    eval_writer.flush()
    workdir.publish('tensorboard')
    workdir.write_json(workdirs.File.METRICS, result)
  metrics.log_done(result, workdir.url)
  # After the Done line: the log it uploads ends with it.
  tracking.finish([workdirs.File.METRICS, workdirs.File.RUN, 'export', 'export_best',
                   console.LOG_FILE, 'tensorboard'])
  return result


def _resume(plan, trainer):
  """The run's checkpoint series and KeepBest's (None without
  keep_best_metric), the newest checkpoint restored; a run that starts at
  step 0 loads init_from's weights instead (a resumed run keeps its own).
  Returns them and the step the run starts at."""
  config = plan.outputs
  hardware, workdir = plan.hardware, plan.workdir

  def start_average_here(path):
    # A run that resumes with a moving average it did not keep before.
    logging.info('%s holds no moving average: it starts from its weights',
                 path)
    trainer.ema.reset()

  def checkpointer_of(series, keep):
    return Checkpointer(workdir, keep, hardware.is_chief, series=series,
                        if_missing={'ema': start_average_here},
                        files=trainer.checkpoint_files)

  checkpointer = checkpointer_of('checkpoints', config.keep_checkpoints)
  checkpointer.restore_latest()
  initial_step = trainer.step
  if initial_step:
    logging.info('Resuming at step %d of %d', initial_step, plan.total_steps)
  elif plan.fine_tuning.init_from:
    logging.info('Initialized the %s', finetune.load_init_from(
        plan.fine_tuning, trainer.model, plan.source.class_names,
        workdir.staging_root))
    trainer.read_back()
    if trainer.ema:
      trainer.ema.reset()
  keep_best = (actions.KeepBest(config.keep_best_metric,
                                checkpointer_of('checkpoints_best', 1),
                                workdir, hardware.is_chief)
               if config.keep_best_metric else None)
  return checkpointer, keep_best, initial_step


def _write_plan_text(plan, writer, step):
  """The plan and config as TensorBoard text, so overlaid runs can be told
  apart (the Text tab)."""
  with writer.as_default(step=step):
    tf.summary.text('plan', '\n'.join(f'- {line}'
                                       for line in plan.describe()))
    tf.summary.text('config', f'```\n{json.dumps(plan.given_config(), indent=2, default=str)}'
                    '\n```')


def run_loop(trainer, batches, plan, initial_step, periodic_actions):
  """Runs executions of `plan.steps_per_execution` steps to the last step.

  After each, every action gets the Execution: the loop knows nothing of
  logging, checkpoints, evaluation or preemption. An execution ends where a
  frozen backbone thaws (the trainer switches functions there), where a
  stage of progressive learning ends (`batches`, a stages.StagedInput,
  gives the next stage's input from its first step) and where an
  evaluation is due (it then evaluates the weights of its own step).
  """
  step, every = initial_step, plan.eval_every_steps
  while step < plan.total_steps:
    end = min(step + plan.steps_per_execution, batches.end_of_stage(step),
              (step // every + 1) * every if every else plan.total_steps)
    if step < plan.frozen_steps:
      end = min(end, plan.frozen_steps)
    num_steps = end - step
    iterator, programs = batches.at(step), trainer.compiled_programs()
    start = time.perf_counter()
    outputs = trainer.train(iterator, num_steps)
    # The stage's input is StagedInput's alone, to release when spent.
    del iterator
    execution = actions.Execution(
        step, step + num_steps, plan.total_steps, time.perf_counter() - start,
        outputs, compiled=trainer.compiled_programs() > programs)
    try:
      for action in periodic_actions:
        action(execution)
      step = execution.step
    except actions.RolledBack as rollback:  # Divergence recovery.
      step = rollback.step
