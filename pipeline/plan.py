"""The resolved run: every choice made once, before any model is built.

`resolve(config, request)` finds the hardware and strategy, resolves the
precision policy, XLA and steps per execution (each with its reason), checks
the config, the workdir and the data, and sizes the run. The result is one
frozen `Plan`: `run.json` is `Plan.to_json()`, `--dry_run` prints it, and the
training loop, the benchmark and launch.compare read it rather than choosing
again.
"""

import dataclasses
from typing import Optional

from absl import logging

from pipeline import backend as backend_lib
from pipeline import cache as cache_lib
from pipeline import compile_cache as compile_cache_lib
from pipeline import devices
from pipeline import finetune
from pipeline import models
from pipeline import precision
from pipeline import saved_policy
from pipeline import sources
from pipeline import storage
from pipeline import validation
from pipeline.errors import UserError

# Fields that must match for a workdir's checkpoints to be restorable.
RUN_IDENTITY = ('dataset', 'model', 'image_size')


@dataclasses.dataclass(frozen=True)
class Request:
  """What the command line asked for (launch/cli.py fills it from flags)."""
  workdir: Optional[str] = None  # None: a run that writes none (benchmark).
  staging_dir: str = '/tmp/pipeline-staging'  # Local copy of a gs:// workdir.
  policy: str = 'auto'
  xla: str = 'auto'
  tpu: str = ''
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  tpu_runtime_version: str = ''
  gpus: str = ''
  num_cpu_devices: int = 1
  collective: str = 'auto'
  collective_timeout_s: float = 300.0  # Bounds every collective.
  allow_cpu: bool = False  # Train on the CPU beside unusable NVIDIA GPUs.
  # A gs:// workdir's lease lapses this long after its holder's last renewal.
  workdir_lease_s: float = 120.0
  trains: bool = True  # False: reads another run's workdir (launch.evaluate).

  def find_hardware(self):
    if backend_lib.current()[0] == 'jax':
      from pipeline import devices_jax  # pylint: disable=g-import-not-at-top
      return devices_jax.resolve(self)
    return devices.resolve(self.tpu, self.tpu_zone, self.gcp_project,
                           self.num_cpu_devices, self.collective,
                           self.collective_timeout_s, self.gpus,
                           self.tpu_runtime_version, self.allow_cpu)


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything resolved before training: printed, saved, and used."""
  hardware: devices.Hardware
  precision: precision.Precision
  xla: bool
  xla_reason: str
  steps_per_execution: int
  steps_per_execution_reason: str
  global_batch_size: int
  peak_learning_rate: float
  source: sources.Source
  steps_per_epoch: int
  total_steps: int
  workdir: Optional[storage.Workdir]
  cache: str = 'decoded'  # cache.choose's kind: none, decoded, encoded.
  cache_reason: str = ''
  frozen_steps: int = 0  # Fine-tuning: steps that train the head alone.
  backend: str = 'tensorflow'  # Keras' backend: 'tensorflow' or 'jax'.
  backend_reason: str = ''
  compile_cache: Optional[compile_cache_lib.Settings] = None

  @property
  def policy(self):
    return self.precision.policy

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

  def to_json(self):
    """The resolved run as run.json's 'resolved' object."""
    hw = self.hardware
    return {
        'backend': self.backend,
        'backend_reason': self.backend_reason,
        'device_kind': hw.device_kind,
        'devices': hw.detail,
        'strategy': hw.strategy_name,
        'num_replicas': hw.num_replicas,
        'num_workers': hw.num_workers,
        'policy': self.policy,
        'policy_reason': self.precision.reason,
        'loss_scaling': self.precision.loss_scaling,
        'graph_rewrite': self.precision.graph_rewrite,
        'xla': self.xla,
        'xla_reason': self.xla_reason,
        'compile_cache': (self.compile_cache.directory if self.compile_cache
                          else None),
        'global_batch_size': self.global_batch_size,
        'per_replica_batch_size': self.per_replica_batch_size,
        'steps_per_execution': self.steps_per_execution,
        'steps_per_execution_reason': self.steps_per_execution_reason,
        'peak_learning_rate': self.peak_learning_rate,
        'dataset': self.source.name,
        'num_classes': self.source.num_classes,
        'train_examples': self.source.num_train_examples,
        'eval_examples': self.source.num_eval_examples,
        'steps_per_epoch': self.steps_per_epoch,
        'examples_per_epoch': self.examples_per_epoch,
        'total_steps': self.total_steps,
        'frozen_steps': self.frozen_steps,
        'cache': self.cache,
        'cache_reason': self.cache_reason,
        'workdir': self.workdir.url if self.workdir else None,
        'software': devices.software(),
    }

  def describe(self, config):
    """The plan as the lines a run prints first."""
    hw, p = self.hardware, self.precision
    return [
        f'Backend: {self.backend} ({self.backend_reason})',
        f'Run: {hw.device_kind} ({hw.detail}) with {hw.strategy_name}, '
        f'{hw.num_replicas} replica(s) over {hw.num_workers} worker(s)',
        f'Software: {devices.software()}',
        f'Precision: {p.policy} ({p.reason}'
        f'{"; " + p.graph_rewrite if p.graph_rewrite else ""}); loss scaling '
        f'{"on" if p.loss_scaling else "off"}',
        f'XLA: {"on" if self.xla else "off"} ({self.xla_reason})'
        + (f'; {self.compile_cache.describe()}'
           if self.xla and self.compile_cache else ''),
        f'Batch: {self.global_batch_size} global, '
        f'{self.per_replica_batch_size} per replica; '
        f'{self.steps_per_execution} steps per execution '
        f'({self.steps_per_execution_reason})',
        f'Workdir: {self.workdir.url if self.workdir else "none"}',
        f'Data: {self.source.name}, {self.source.num_classes} classes, '
        f'{self.source.num_train_examples} train / '
        f'{self.source.num_eval_examples} eval examples; {self.total_steps} '
        f'steps ({config.epochs} epochs of {self.steps_per_epoch}); peak '
        f'learning rate {self.peak_learning_rate:.3g} = base '
        f'{config.base_learning_rate:g} x {self.global_batch_size} global / '
        '256',
        f'Input: cache {self.cache} ({self.cache_reason}); augment '
        f'{config.augment}{_mixing(config)}'
        + (f'; training input from tf.data service {config.data_service} '
           '(sharding OFF: each worker streams the whole set)'
           if config.data_service else ''),
        self._recipe(config),
    ]

  def _recipe(self, config):
    """The model and optimisation choices, in one line."""
    accumulation = config.gradient_accumulation_steps
    ema_decay = config.ema_decay
    return (
        f'Recipe: {config.model}, stochastic depth '
        f'{config.drop_connect_rate:g}; {config.optimizer}, '
        f'{config.lr_schedule} schedule'
        + (f'; {accumulation} micro-batches of '
           f'{self.global_batch_size // accumulation} per update (steps '
           'count updates)' if accumulation > 1 else '')
        + (f'; moving average {ema_decay:g} (evaluated and exported)'
           if ema_decay else '; no moving average')
        + f'; {finetune.describe(config.init_from)}'
        + (f', backbone frozen for the first {self.frozen_steps} steps'
           if self.frozen_steps else ''))


def resolve(config, request, hardware=None):
  """Resolves and checks everything a run needs, short of building a model.

  Hardware (unless given: tests hand in a TPU's), precision, XLA, steps per
  execution, the config's values, workdir access (the bucket preflight for
  gs://) and its identity, the data source and its size, the cache and the
  batch split. Logs the plan; raises a one-line UserError for any mistake.
  """
  backend, backend_reason = backend_lib.current()
  # First, so a backend that then finds no hardware has said why it ran.
  logging.info('Backend: %s (%s)', backend, backend_reason)
  hardware = hardware or request.find_hardware()
  resolved_precision = precision.resolve(request.policy, hardware.device_kind,
                                         hardware.gpu_compute_capability,
                                         backend, _measured(request, hardware,
                                                            backend))
  xla, xla_reason = choose_xla(request.xla, hardware, resolved_precision.policy,
                               backend)
  check_cudnn(xla, hardware)
  steps_per_execution, steps_reason = choose_steps_per_execution(
      config.steps_per_execution, hardware.device_kind)
  validation.validate(config, hardware.num_replicas, models.MODELS)
  workdir = _open_workdir(config, request, hardware, backend)
  source = sources.load_source(config)
  cache, cache_reason = cache_lib.choose(config, source)
  steps_per_epoch = epoch_steps(config.examples_per_epoch,
                                source.num_train_examples,
                                config.global_batch_size)
  plan = Plan(
      hardware=hardware, precision=resolved_precision, xla=xla,
      xla_reason=xla_reason, steps_per_execution=steps_per_execution,
      steps_per_execution_reason=steps_reason,
      global_batch_size=config.global_batch_size,
      peak_learning_rate=config.base_learning_rate *
      config.global_batch_size / 256,
      source=source, steps_per_epoch=steps_per_epoch,
      total_steps=config.epochs * steps_per_epoch, workdir=workdir,
      cache=cache, cache_reason=cache_reason,
      frozen_steps=finetune.frozen_steps(config, steps_per_epoch),
      backend=backend, backend_reason=backend_reason,
      compile_cache=_compile_cache(config))
  for line in plan.describe(config)[1:]:  # The backend's line is out.
    logging.info('%s', line)
  return plan


def _measured(request, hardware, backend):
  """The policy the user's saved sweep found fastest on this GPU model and
  software, with its reason; None elsewhere."""
  if (request.policy != 'auto' or backend != 'tensorflow' or
      not hardware.gpu_name):
    return None
  return saved_policy.load(hardware.gpu_name,
                           compile_cache_lib.versions(backend))


def _compile_cache(config):
  """What environment.prepare set up before TensorFlow loaded (None in a
  process that did not run it); the config must agree with it."""
  settings = compile_cache_lib.chosen()
  if settings and config.compile_cache_dir != settings.setting:
    raise UserError(
        f'compile_cache_dir={config.compile_cache_dir!r} came from a config '
        'file; XLA reads it as TensorFlow loads, before configs are: give it '
        f'on the command line, --config.compile_cache_dir='
        f'{config.compile_cache_dir}')
  return settings


def _open_workdir(config, request, hardware, backend):
  """The run's Workdir, checked: TPU Node paths, writability, identity."""
  if request.workdir is None:
    return None
  if hardware.tpu_workers_remote:
    storage.check_remote_tpu_paths(config, request.workdir)
  workdir = storage.Workdir(request.workdir, request.staging_dir,
                            lease_s=request.workdir_lease_s)
  if hardware.is_chief:
    workdir.check()  # For gs://: bucket exists and takes a write, or one line.
    if not _check_same_run(workdir, config,
                           backend if request.trains else None):  # Starts.
      finetune.check_source(config, request.staging_dir)
  return workdir


def _check_same_run(workdir, config, backend=None):
  """A one-line UserError if the workdir holds another run, or (given the
  `backend` that would resume it) this one trained on the other backend:
  each resumes from its own checkpoint files, and the other's would be
  passed over and the run start again. Whether it holds this run."""
  saved = workdir.read_json('run.json')
  if not saved:
    return False
  for key in RUN_IDENTITY:
    if saved['config'].get(key) != config[key]:
      raise UserError(
          f'workdir {workdir.url!r} holds a run with {key}='
          f'{saved["config"].get(key)!r}, not {config[key]!r}; use another '
          '--workdir to start a new run')
  trained_on = saved.get('resolved', {}).get('backend', 'tensorflow')
  if backend and trained_on != backend:
    raise UserError(
        f'workdir {workdir.url!r} holds a run trained on {trained_on}, which '
        f'resumes there only: --backend={trained_on}, or another --workdir')
  return True


def _mixing(config):
  mixes = [f'{name} {config[f"{name}_alpha"]:g}'
           for name in ('mixup', 'cutmix') if config[f'{name}_alpha']]
  return (f'; {" or ".join(mixes)} per batch (training accuracy is against '
          'the dominant label)' if mixes else '')


def choose_xla(requested, hardware, policy=None, backend='tensorflow',
               tensorflow_version=None):
  """Returns (on, reason) for --xla=auto|on|off on this hardware
  (`tensorflow_version`: the installed one unless given, for tests)."""
  if backend == 'jax':
    if requested == 'off':
      raise UserError('--xla=off: JAX compiles every program with XLA; use '
                      '--backend=tensorflow to train without it')
    return True, 'JAX compiles every program with XLA'
  ruled = precision.xla_rule(policy, requested, hardware.device_kind)
  if ruled:
    return ruled
  if hardware.device_kind == 'TPU':
    return True, 'TPU programs are always compiled by XLA'
  if requested == 'on':
    return True, 'asked for with --xla=on'
  if requested == 'off':
    return False, 'asked for with --xla=off'
  if hardware.num_replicas > 1:
    return False, ('fails under Mirrored strategies in Keras 3 (keras#21366, '
                   'keras#18666)')
  blackwell = _blackwell_on_tf_2_21(hardware, tensorflow_version)
  if blackwell:
    return False, blackwell
  if hardware.device_kind == 'GPU':
    return True, 'single GPU: fused kernels help'
  return False, ('CPU: XLA measured 8x slower than TF kernels here '
                 '(BUILD_NOTES.md)')


def _blackwell_on_tf_2_21(hardware, tensorflow_version=None):
  """Why XLA stays off on a Blackwell GPU (compute capability 10.x, 12.x)
  under TensorFlow 2.21, or None: its XLA crashes there with "PTX version
  8.5 does not support target sm_120" (tensorflow#111958; fixed in
  openxla/xla#48532 after 2.21.0)."""
  capability = hardware.gpu_compute_capability
  if hardware.device_kind != 'GPU' or not capability or capability[0] not in (
      10, 12):
    return None
  version = tensorflow_version or devices.tensorflow_version()
  if not version.startswith('2.21'):
    return None
  return (f'compute capability {capability[0]}.{capability[1]} (Blackwell) '
          f'with TensorFlow {version}: its XLA fails with "PTX version 8.5 '
          'does not support target sm_120" (tensorflow#111958, fixed after '
          '2.21.0); --xla=on to try anyway')


def check_cudnn(xla, hardware, cudnn_version=None):
  """One warning line where XLA runs on a GPU with a cuDNN older than 9.24
  (`cudnn_version`: the installed wheel's unless given, for tests): TF
  2.21's XLA convolutions then fail with "Autotuner could not find any
  supported configs" (aws/deep-learning-containers#6418). Returns it."""
  if not xla or hardware.device_kind != 'GPU':
    return None
  version = cudnn_version or devices.installed('nvidia-cudnn-cu12')
  if not version or _release(version) >= (9, 24):
    return None
  line = (f'cuDNN {version} is older than 9.24, whose XLA convolutions fail '
          'on TensorFlow 2.21 ("Autotuner could not find any supported '
          'configs"); pip install -r requirements-gpu.txt')
  logging.warning('%s', line)
  return line


def _release(version):
  return tuple(int(part) for part in version.split('.')[:2])


# Steps per execution when the config leaves it at 0. Each execution is one
# host round trip: on a TPU that is a launch of a whole XLA program (over the
# network on a TPU Node) for steps of a few milliseconds, so it takes many
# steps to hide; tensorflow/tpu's EfficientNet ran an epoch per loop
# (iterations_per_loop). On CPU and GPU a call costs far less than a step and
# 8 only trims Python overhead; more would delay logs and preemption saves.
_AUTO_STEPS_PER_EXECUTION = {'TPU': 100, 'GPU': 8, 'CPU': 8}


def choose_steps_per_execution(requested, device_kind):
  """Returns (steps, reason): `requested` if 1 or more, 0 picks per device."""
  if requested:
    return requested, 'set in the config'
  return (_AUTO_STEPS_PER_EXECUTION[device_kind],
          f'auto for {device_kind}: 100 on TPU, 8 on CPU and GPU')


def epoch_steps(requested_examples, num_train_examples, global_batch_size):
  """Steps per epoch for one run: see examples_per_epoch."""
  return examples_per_epoch(requested_examples, num_train_examples,
                            [global_batch_size]) // global_batch_size


def examples_per_epoch(requested, num_train_examples, batch_sizes):
  """Examples per epoch that every global batch in `batch_sizes` divides.

  `requested` (the config's examples_per_epoch) if set: it must be whole
  batches, so runs with different batches (launch.compare) see exactly the
  same examples. 0: the largest multiple of the biggest batch that fits in
  the training set (for one batch, the set rounded down to whole batches).
  """
  if requested:
    for batch in sorted(set(batch_sizes)):
      if requested < 0 or requested % batch:
        raise UserError(f'examples_per_epoch={requested} must be 0 (the '
                        'training set) or a multiple of the global batch; '
                        f'it is not a multiple of global batch {batch}')
    return requested
  biggest = max(batch_sizes)
  examples = num_train_examples // biggest * biggest
  if not examples:
    raise UserError(f'global_batch_size={biggest} is larger than the '
                    f'{num_train_examples} training examples')
  for batch in batch_sizes:
    if examples % batch:  # Only when batches are not multiples of each other.
      raise UserError(f'global batches {sorted(set(batch_sizes))} have no '
                      'common multiple that fits the training set; set '
                      '--config.examples_per_epoch')
  return examples
