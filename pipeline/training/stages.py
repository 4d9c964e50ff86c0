"""The training input of the stage a step is in (recipe/progressive.py).

Where progressive learning is off the run has one stage and one input, as
before. Otherwise, as a stage begins (a run starting or resuming in it,
or the loop reaching its first step) its input is built from the stage's
own spec (the plan's: its size, RandAugment magnitude and mixup), the
model's head dropout is set to its rate, and the first execution's
compile is counted: each size is one more program of the training step,
which the log says.
"""

from absl import logging

from pipeline.data import inputs
from pipeline.data import spent_iterators
from pipeline.recipe import models
from pipeline.recipe import progressive


class StagedInput:
  """`at(step)`: an iterator of the training batches of `step`'s stage."""

  def __init__(self, plan, trainer, service_job):
    self.plan, self.trainer, self.service_job = plan, trainer, service_job
    self.stage, self.iterator = None, None

  def at(self, step):
    stage = progressive.stage_at(self.plan.stages, step)
    if stage is not self.stage:
      self._begin(stage, step)
    return self.iterator

  def end_of_stage(self, step):
    """The step the stage of `step` ends at (an execution stops there)."""
    return progressive.stage_at(self.plan.stages, step).end_step

  def _begin(self, stage, step):
    plan, count = self.plan, len(self.plan.stages)
    if count > 1:
      models.set_head_dropout(self.trainer.model, stage.dropout_rate)
      logging.info('Progressive learning, %s%s', stage.describe(
          count, stage.input.augmentation.randaugment),
                   f' (resumed at step {step})' if step > stage.first_step
                   else '')
    job = self.service_job + (f':stage{stage.index}' if count > 1 else '')
    if self.iterator is not None:
      # Its destruction can stand still for up to a minute; not here.
      spent_iterators.release(self.iterator)
    self.iterator = iter(plan.backend.distribute(
        plan.hardware, inputs.train_input(plan, job, stage.input)))
    self.stage = stage

  def after_execution(self, execution):
    """A periodic action: logs the programs the step has compiled in this
    run, where the execution compiled one more (a stage's first size)."""
    if execution.compiled and len(self.plan.stages) > 1:
      logging.info('Compiled the training step for %d px: %d program(s) in '
                   'this run', self.stage.image_size,
                   self.trainer.compiled_programs())
