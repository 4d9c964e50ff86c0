"""A plan as the lines a run prints first, one per concern: backend,
hardware, software, precision, XLA, batch, workdir, data, input, stages,
recipe."""

from pipeline.data import sources
from pipeline.rules.machine import hardware as hardware_lib
from pipeline.recipe import models


def lines(plan):
  """The plan as the lines a run prints first."""
  config, hw, p = plan.config, plan.hardware, plan.precision
  return [
      f'Backend: {plan.backend.name} ({plan.backend_reason})',
      f'Run: {hw.device_kind} ({hw.detail}) with {hw.strategy_name}, '
      f'{hw.num_replicas} replica(s) over {hw.num_workers} worker(s)'
      + (f'; {hw.num_workers} processes joined by {hw.cluster}, this is '
         f'process {hw.task_index}' if hw.cluster else '')
      + (f'; {hw.gpu_share}' if hw.gpu_share else ''),
      f'Software: {hardware_lib.software()}',
      f'Precision: {p.policy} ({p.reason}'
      f'{"; " + p.graph_rewrite if p.graph_rewrite else ""}); loss scaling '
      f'{"on" if p.loss_scaling else "off"}',
      f'XLA: {"on" if plan.xla else "off"} ({plan.xla_reason})'
      + (f'; {plan.compile_cache.describe()}'
         if plan.xla and plan.compile_cache else '')
      + (f'; the step is held to {plan.saved_rate[0]:,.0f} img/s, '
         f'measured by {plan.saved_rate[1]}' if plan.saved_rate else ''),
      f'Batch: {plan.global_batch_size} global, '
      f'{plan.per_replica_batch_size} per replica; '
      f'{plan.steps_per_execution} steps per execution '
      f'({plan.steps_per_execution_reason})',
      f'Workdir: {plan.workdir.url if plan.workdir else "none"}',
      f'Data: {plan.source.name}, {plan.source.num_classes} classes, '
      + (f'{plan.source.num_train_examples} train / '
         f'{plan.source.num_eval_examples} eval examples; '
         if plan.source.counted else
         'its sizes known once tensorflow-datasets has prepared it (the '
         'run prepares it first); ')
      + f'{plan.image_sizes.describe()}; '
      + (f'{plan.total_steps} steps ({config.epochs} epochs of '
         f'{plan.steps_per_epoch}); ' if plan.source.counted else
         f'{config.epochs} epochs; ')
      + f'peak learning rate {plan.peak_learning_rate:.3g} = base '
      f'{config.base_learning_rate:g} x {plan.global_batch_size} global / '
      '256',
      *([f'Classes: {_names(plan.source.class_names)}']
        if sources.SOURCES.of(config).names_classes and plan.source.class_names
        else []),
      f'Input: {plan.input_pipeline} ({plan.input_pipeline_reason}); '
      f'cache {plan.cache_kind} ({plan.cache_reason}); '
      f'{plan.input.describe(plan.chosen.augment_reason)}',
      *([f'Progressive learning: off ({plan.chosen.stages_off})']
        if plan.chosen.stages_off else []),
      *([f'Progressive learning: '
         f'{stage.describe(len(plan.stages), plan.input.augmentation.randaugment)}'
         for stage in plan.stages] if len(plan.stages) > 1 else []),
      _recipe(plan),
  ]


def _recipe(plan):
  """The model and optimisation choices, in one line."""
  config = plan.config
  accumulation = config.gradient_accumulation_steps
  ema_decay = config.ema_decay
  family = models.MODELS[config.model]
  return (
      f'Recipe: {config.model}, '
      f'{family.describe_stochastic_depth(config.drop_connect_rate)}; '
      f'{config.optimizer}, '
      f'{config.lr_schedule} schedule'
      + (f'; {accumulation} micro-batches of '
         f'{plan.global_batch_size // accumulation} per update (steps '
         'count updates)' if accumulation > 1 else '')
      + (f'; moving average {ema_decay:g} (evaluated and exported)'
         if ema_decay else '; no moving average')
      + f'; {plan.initial_weights}'
      + (f', backbone frozen for the first {plan.frozen_steps} steps'
         if plan.frozen_steps else ''))


def _names(names, shown=20):
  """The class names as the plan prints them: 'cat, dog' (index order)."""
  more = f', ... ({len(names) - shown} more)' if len(names) > shown else ''
  return ', '.join(names[:shown]) + more
