"""The resolved run: every choice made once, before any model is built.

`resolve(config, request)` finds the hardware and strategy (through the
chosen backend, which the plan carries), resolves the
precision policy, XLA and steps per execution (each with its reason), checks
the config, the workdir and the data, and sizes the run. The result is one
frozen `Plan`: `run.json` is `Plan.to_json()`, `--dry_run` prints it, and the
training loop, the benchmark and launch.compare read it rather than choosing
again. The plan carries the config it was resolved from, read in run/
alone: what runs takes the plan's fields, the keys each consumer reads
handed down as Settings (`recipe`, `outputs`), a key not named there an
error where it is read.
"""

import dataclasses
from typing import Optional

from absl import logging
import ml_collections

from pipeline import backends
from pipeline import parts
from pipeline.backends import interface
from pipeline.data import augmentations
from pipeline.data import cache as cache_lib
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.data import input_spec
from pipeline.data import sources
from pipeline.rules.config import classes
from pipeline.rules.speed import compile_cache as compile_cache_lib
from pipeline.rules.machine import hardware as hardware_lib
from pipeline.rules.machine import placement
from pipeline.rules.speed import precision
from pipeline.rules.speed import saved_policy
from pipeline.rules.speed import saved_rate
from pipeline.rules.speed import step_counts
from pipeline.rules.config import validation
from pipeline.run import left_open
from pipeline.run import plan_lines
from pipeline.run import run_workdir
from pipeline.storage import checkpoint_format
from pipeline.storage import workdirs
from pipeline import recipe
from pipeline.recipe import finetune
from pipeline.recipe import layers
from pipeline.recipe import optimizers
from pipeline.recipe import schedules
from pipeline.recipe import objective as objective_lib
from pipeline.recipe import progressive

@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything resolved before training: printed, saved, and used."""
  # The config it was resolved from; its resolved fields are the plan's.
  config: ml_collections.ConfigDict = dataclasses.field(compare=False,
                                                        repr=False)
  hardware: hardware_lib.Hardware
  precision: precision.Precision
  xla: bool
  xla_reason: str
  steps_per_execution: int
  steps_per_execution_reason: str
  peak_learning_rate: float
  source: sources.Source
  held_out: str  # The split evaluation reads, as the source names it.
  steps_per_epoch: int
  total_steps: int
  workdir: Optional[workdirs.Workdir]
  cache_kind: cache_lib.Kind  # What the input caches (data/cache.py).
  cache_reason: str
  frozen_steps: int  # Fine-tuning: steps that train the head alone.
  backend: interface.Backend  # The backend that runs it.
  backend_reason: str
  compile_cache: Optional[compile_cache_lib.Settings]
  input_pipeline: input_pipeline_lib.Pipeline
  input_pipeline_reason: str
  staging_dir: str  # Local files of the run: gs:// copies, DALI's index.
  initial_weights: str  # init_from's, described.
  profile_window: Optional[tuple]  # profile_steps: (start, stop).
  # (images/s, source) launch.probe saved for this card and step, which
  # the progress lines hold the step to (saved_rate.py); None: none saved.
  saved_rate: Optional[tuple]
  # The parts each consumer takes: what the step minimises (over the
  # data's classes), how the input pipelines prepare examples, where the
  # first weights come from.
  objective: objective_lib.Objective
  input: input_spec.InputSpec
  fine_tuning: finetune.FineTuning
  # The changes from the workdir's run this one accepted (--accept_changes;
  # run_workdir.Change.to_json's), with the earlier runs' first: run.json's.
  accepted_changes: tuple
  # What the keys a config may leave open came to, and why: the sizes
  # it trains and evaluates at, its augmentation, its stages' count.
  chosen: left_open.Choices
  # Its stages of progressive learning: one, the whole run, where it is off.
  stages: tuple
  # The config's keys the recipe's builders read (the network, optimizer,
  # schedule, the update) and the run's outputs (logs, checkpoints,
  # exports, trackers, recovery): as given, nothing left to resolve.
  recipe: parts.Settings = dataclasses.field(compare=False, repr=False)
  outputs: parts.Settings = dataclasses.field(compare=False, repr=False)

  @property
  def policy(self):
    return self.precision.policy

  @property
  def image_sizes(self):
    return self.chosen.sizes

  @property
  def global_batch_size(self):
    """The config's: the batch is taken as given, in one place."""
    return self.config.global_batch_size

  @property
  def per_replica_batch_size(self):
    return self.global_batch_size // self.hardware.num_replicas

  @property
  def io_device(self):
    """Where checkpoint and export files are read and written: this host
    for a TPU Node, whose variables live on remote hosts; None: default."""
    return '/job:localhost' if self.hardware.tpu_workers_remote else None

  @property
  def examples_per_epoch(self):
    return self.steps_per_epoch * self.global_batch_size

  @property
  def eval_every_steps(self):
    """Steps between evaluations (eval_every_epochs'); 0: at the end only."""
    return int(round(self.steps_per_epoch * self.config.eval_every_epochs))

  def out_of_memory_message(self):
    """One line for an accelerator (or host) that ran out of memory."""
    config, hardware = self.config, self.hardware
    return (f'out of memory on {hardware.device_kind} ({hardware.detail}): '
            f'{config.model} at image_size={self.image_sizes.train}, '
            f'{self.source.num_classes} classes, with '
            f'{self.per_replica_batch_size} images per replica '
            f'(global_batch_size={self.global_batch_size}) under '
            f'{self.policy}; lower --config.global_batch_size or '
            '--config.image_size, or pick a smaller model'
            + ('' if self.precision.sixteen_bit else
               ' or a 16-bit --policy (half the activation memory)'))

  def to_json(self):
    """The resolved run as run.json's 'resolved' object."""
    hw = self.hardware
    return {
        'backend': self.backend.name, 'backend_reason': self.backend_reason,
        checkpoint_format.KEY: str(self.backend.checkpoint_format),
        'device_kind': hw.device_kind, 'devices': hw.detail,
        'strategy': hw.strategy_name, 'num_replicas': hw.num_replicas,
        'num_workers': hw.num_workers, 'joined_by': hw.cluster or None,
        'gpu_share': hw.gpu_share or None,
        'policy': self.policy, 'policy_reason': self.precision.reason,
        'loss_scaling': self.precision.loss_scaling,
        'graph_rewrite': self.precision.graph_rewrite,
        'xla': self.xla, 'xla_reason': self.xla_reason,
        'compile_cache': (self.compile_cache.directory if self.compile_cache
                          else None),
        'global_batch_size': self.global_batch_size,
        'per_replica_batch_size': self.per_replica_batch_size,
        'steps_per_execution': self.steps_per_execution,
        'steps_per_execution_reason': self.steps_per_execution_reason,
        'peak_learning_rate': self.peak_learning_rate,
        'image_size': self.image_sizes.train,
        'eval_image_size': self.image_sizes.eval,
        'image_sizes': self.image_sizes.describe(),
        'augment': self.input.augmentation.name,
        'augment_reason': self.chosen.augment_reason,
        'progressive_stages': ([stage.to_json() for stage in self.stages]
                               if len(self.stages) > 1 else []),
        'dataset': self.source.name, 'num_classes': self.source.num_classes,
        'class_names': list(self.source.class_names),
        'train_examples': self.source.num_train_examples,
        'eval_examples': self.source.num_eval_examples,
        'steps_per_epoch': self.steps_per_epoch,
        'examples_per_epoch': self.examples_per_epoch,
        'total_steps': self.total_steps, 'frozen_steps': self.frozen_steps,
        'initial_weights': self.initial_weights,
        'cache': str(self.cache_kind), 'cache_reason': self.cache_reason,
        'input_pipeline': str(self.input_pipeline),
        'input_pipeline_reason': self.input_pipeline_reason,
        'workdir': self.workdir.url if self.workdir else None,
        'software': hardware_lib.software(),
    }

  def given_config(self):
    """The config as given (defaults filled in), a plain dict: what run.json,
    the trackers and TensorBoard record beside the plan."""
    return self.config.to_dict()

  def run_record(self):
    """run.json: the resolved run, the config, the changes it accepted."""
    return {'resolved': self.to_json(), 'config': self.given_config(),
            'accepted_changes': list(self.accepted_changes)}

  def describe(self):
    """The plan as the lines a run prints first (plan_lines.py)."""
    return plan_lines.lines(self)


def resolve(config, request, hardware=None):
  """Resolves and checks everything a run needs, short of building a model.

  Hardware (unless given: tests hand in a TPU's), precision, XLA, steps per
  execution, the config's values, workdir access (the bucket preflight for
  gs://) and its identity, the data source and its size, the cache and the
  batch split. Logs the plan; raises a one-line UserError for any mistake.
  """
  backend, backend_reason = backends.chosen()
  # First, so a backend that then finds no hardware has said why it ran.
  logging.info('Backend: %s (%s)', backend.name, backend_reason)
  hardware = hardware or backend.resolve_hardware(request)
  validation.validate(config, hardware.num_replicas, recipe.tables(),
                      (sources.SOURCES, augmentations.AUGMENTATIONS))
  run_workdir.check_remote_paths(request, hardware, sources.inputs(config),
                                 input_spec.cache_setting(config.cache))
  # The data first: what the config leaves open (the image size, the
  # augmentation), the data decide, and the workdir's recipe holds that.
  source = sources.load_source(config, prepare=not request.dry_run)
  chosen = left_open.choose(config, source)
  sizes = chosen.sizes
  # After the sizes: a CPU's measured policy is kept per network and size.
  resolved_precision, xla, xla_reason = _precision_and_xla(
      request, hardware, backend, saved_policy.step_of(config.model,
                                                       sizes.train))
  steps_per_execution, steps_reason = step_counts.choose_steps_per_execution(
      config.steps_per_execution, hardware.device_kind,
      config.global_batch_size // hardware.num_replicas *
      sizes.train**2 * 3)
  spec = input_spec.InputSpec.of(config, sizes.train, sizes.eval,
                                 chosen.augment,
                                 staged=bool(chosen.progression.count))
  opened = run_workdir.open_workdir(
      config, request, hardware, backend, resolved_precision.policy,
      chosen.resolved)
  workdir, resumed = opened.workdir, opened.resumed
  tuning = finetune.FineTuning.of(config, sizes.train)
  initial_weights = finetune.describe(tuning)
  if workdir and hardware.is_chief:
    if resumed:
      classes.check_resumed(workdir, source.class_names)
    else:
      initial_weights = finetune.check_source(
          tuning, source.class_names, request.staging_dir)
  input_pipeline, input_reason, cache_kind, cache_reason = _input(
      config.input_pipeline, spec, source, hardware)
  steps_per_epoch = (step_counts.epoch_steps(config.examples_per_epoch,
                                             source.num_train_examples,
                                             config.global_batch_size)
                     if source.counted else 0)
  plan = Plan(
      config=config, hardware=hardware, precision=resolved_precision, xla=xla,
      xla_reason=xla_reason, steps_per_execution=steps_per_execution,
      steps_per_execution_reason=steps_reason,
      peak_learning_rate=config.base_learning_rate *
      config.global_batch_size / 256,
      source=source, steps_per_epoch=steps_per_epoch,
      held_out=sources.SOURCES.of(config).held_out(
          sources.SOURCES.settings(config)),
      total_steps=config.epochs * steps_per_epoch, workdir=workdir,
      cache_kind=cache_kind, cache_reason=cache_reason,
      frozen_steps=finetune.frozen_steps(tuning, steps_per_epoch),
      backend=backend, backend_reason=backend_reason,
      compile_cache=compile_cache_lib.chosen_for(config.compile_cache_dir),
      input_pipeline=input_pipeline,
      input_pipeline_reason=input_reason, staging_dir=request.staging_dir,
      initial_weights=initial_weights,
      profile_window=validation.profile_window(config.profile_steps),
      saved_rate=saved_rate.load(
          hardware.gpu_name or hardware.device_kind, backend.software(),
          saved_rate.step_key(config, sizes.train, hardware.num_replicas,
                              resolved_precision.policy)),
      objective=objective_lib.Objective(
          source.num_classes, config.label_smoothing, config.l2_weight_decay),
      input=spec, fine_tuning=tuning,
      accepted_changes=opened.accepted_changes, chosen=chosen,
      stages=progressive.stages(chosen.progression, steps_per_epoch, spec),
      recipe=parts.Settings({key: config[key] for key in (
          *_RECIPE_KEYS, *optimizers.OPTIMIZERS.settings(config),
          *schedules.SCHEDULES.settings(config),
          *(table.key for table in layers.FORM_TABLES))}),
      outputs=parts.Settings({key: config[key] for key in _OUTPUT_KEYS}))
  for line in plan.describe()[1:]:  # The backend's line is out.
    logging.info('%s', line)
  if placement.cpus_line():
    logging.warning('%s', placement.cpus_line())
  return plan


_RECIPE_KEYS = ('model', 'dropout_rate', 'batch_norm_momentum',
                'drop_connect_rate', 'grad_clip_norm', 'warmup_epochs',
                'weight_decay', 'label_smoothing', 'ema_decay',
                'gradient_accumulation_steps', 'seed', 'epochs')
_OUTPUT_KEYS = ('log_every_steps', 'checkpoint_every_steps',
                'keep_checkpoints', 'keep_best_metric', 'export',
                'export_tflite', 'export_onnx', 'tracking',
                'tracking_project', 'recovery_max_trials',
                'recovery_max_skipped_executions')


def _precision_and_xla(request, hardware, backend, step):
  """(the Precision, XLA on?, why) for the request on this hardware and
  backend; `step` (the network and size) keys a CPU's measured policy."""
  resolved = precision.resolve(
      request.policy, hardware.device_kind, hardware.gpu_compute_capability,
      _measured(request, hardware, backend, step), backend.policy,
      request.policy_from)
  return (resolved, *backend.choose_xla(request.xla, hardware,
                                        resolved.policy))


def _input(requested, spec, source, hardware):
  """(input pipeline, why, cache kind, why) for the config's
  input_pipeline `requested`: DALI where asked or measured faster on this
  GPU; tf.data caches what fits."""
  pipeline, reason = input_pipeline_lib.choose(
      requested, spec, source, hardware.device_kind,
      input_pipeline_lib.saved_rates(hardware.gpu_name) if hardware.gpu_name
      else None)
  if pipeline is not input_pipeline_lib.Pipeline.TF_DATA:
    return pipeline, reason, cache_lib.Kind.NONE, 'DALI decodes every epoch'
  return (pipeline, reason, *cache_lib.choose(spec, source))


def find_hardware(request):
  """This process's Hardware, found by the chosen backend (resolve does it
  too; a sweep finds it once for many plans)."""
  return backends.chosen()[0].resolve_hardware(request)


def _measured(request, hardware, backend, step):
  """The policy the user's saved sweep found fastest on this GPU model and
  the backend's software, else the one a saved measurement of both
  backends ran this one under; on a CPU, the sweep saved for its model
  name, the software and `step` (the network and size); with its reason;
  None elsewhere."""
  if request.policy != 'auto':
    return None
  if hardware.device_kind == 'CPU':
    return saved_policy.load(precision.cpu_info()[0], backend.software(),
                             step)
  if not hardware.gpu_name:
    return None
  return (saved_policy.load(hardware.gpu_name, backend.software()) or
          backends.measured_policy(hardware.gpu_name, backend))
