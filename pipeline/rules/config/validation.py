"""The config, completed from configs/default.py and checked field by field.

`complete(values)` is how every config reaches the library: a config file
that omits a key, and a run.json written before a key existed, get that
key's value from configs/default.py, the one home of every default.
`validate(config, num_replicas, recipe_tables, data_tables)` is the one
place a field's value is checked (but the cache's, which the input reads:
pipeline/data/input_spec.py); the modules that use a field trust it. Checks that need the data
(examples_per_epoch, the cache) or the filesystem (init_from's source, the
workdir) happen where those are opened, in pipeline/run/plan.py.
"""

import enum
import importlib.util
import re

import ml_collections

from configs import default
from pipeline.errors import UserError



class Metric(enum.StrEnum):
  """The final evaluation's figures by name: metrics.json's keys, and
  what keep_best_metric may keep the best checkpoint by."""
  EVAL_ACCURACY = 'eval_accuracy'
  EVAL_LOSS = 'eval_loss'


class Tracker(enum.StrEnum):
  """The experiment trackers `tracking` names: their packages' names too."""
  MLFLOW = 'mlflow'
  WANDB = 'wandb'


TFLITE_WEIGHTS = ('', 'float32', 'float16')
ONNX_PACKAGES = ('tf2onnx', 'onnxruntime')  # requirements-onnx.txt
_DATA_SERVICE = re.compile(r'^grpc://[^:/\s]+:\d+$')


def complete(values, source='the config'):
  """A ConfigDict of every default key, `values` (a dict or ConfigDict) on top.

  A key that configs/default.py does not have is a one-line UserError
  naming `source`: a typo there would otherwise be silently ignored.
  """
  defaults = default.get_config().to_dict()
  values = values.to_dict() if hasattr(values, 'to_dict') else dict(values)
  unknown = sorted(set(values) - set(defaults))
  if unknown:
    raise UserError(f'unknown config key {unknown[0]!r} in {source}; the keys '
                    'are the fields of configs/default.py')
  for key, value in values.items():
    if not _same_type(value, defaults[key]):
      raise UserError(
          f'config key {key!r} in {source} is {value!r} '
          f'({type(value).__name__}); configs/default.py has '
          f'{defaults[key]!r} ({type(defaults[key]).__name__})')
  # Built whole, a float key's int made a float as ConfigDict would.
  return ml_collections.ConfigDict(
      {key: float(values[key]) if isinstance(defaults[key], float) and
       key in values else values.get(key, defaults[key])
       for key in defaults})


def _same_type(value, default_value):
  """Whether `value` may stand for a key whose default is `default_value`
  (an int for a float, as ConfigDict takes it)."""
  if isinstance(default_value, bool) or isinstance(value, bool):
    return type(value) is type(default_value)
  if isinstance(default_value, float):
    return isinstance(value, (int, float))
  return isinstance(value, type(default_value))


def profile_window(text):
  """profile_steps '' or 'START,STOP' -> None or (start, stop)."""
  if not text:
    return None
  try:
    start, stop = (int(part) for part in str(text).split(','))
  except ValueError:
    start = stop = -1
  if not 0 <= start < stop:
    raise UserError(f'profile_steps={text!r}; accepted: \'\' (off) or '
                    'START,STOP with 0 <= START < STOP, e.g. 10,20')
  return start, stop


def validate(config, num_replicas, recipe_tables, data_tables):
  """Raises a one-line UserError for the first field that cannot run
  (the cache's value: input_spec.cache_setting, as the spec reads it).

  `recipe_tables`, `data_tables`: the tables of named parts
  (pipeline/parts.py) of the recipe (models, optimizers, schedules, layer
  forms) and of the input (sources, augmentations): each checks the name
  the config gives and that part's keys. Passed in by the plan, so this
  module imports neither floor.
  """
  _check_batch(config, num_replicas)
  _check_recipe(config, recipe_tables)
  _check_input(config, data_tables)
  _check_schedule_of_work(config)


def _one_of(key, value, accepted, describe=None):
  if value not in accepted:
    raise UserError(f'unknown {key} {value!r}; accepted: '
                    + (describe or ', '.join(accepted)))


def _at_least(values, low, why=''):
  """`values`: {key: value}."""
  for key, value in values.items():
    if value < low:
      raise UserError(f'{key}={value} must be {low} or more{why}')


def _check_batch(config, replicas):
  batch = config.global_batch_size
  if batch < 1:
    raise UserError(f'global_batch_size={batch} must be 1 or more')
  if batch % replicas:
    raise UserError(f'global_batch_size={batch} does not split over '
                    f'{replicas} replicas; use a multiple of {replicas}')
  accumulation = config.gradient_accumulation_steps
  if accumulation < 1 or batch % (replicas * accumulation):
    raise UserError(
        f'gradient_accumulation_steps={accumulation} must be 1 or more and '
        f"split each replica's share of global_batch_size={batch} "
        f'({replicas} replica(s)) into equal micro-batches')
  if config.steps_per_execution < 0:
    raise UserError(f'steps_per_execution={config.steps_per_execution} must '
                    'be 1 or more, or 0 to pick one for the device')
  if config.examples_per_epoch < 0:
    raise UserError(f'examples_per_epoch={config.examples_per_epoch} must be '
                    '0 (the training set) or a multiple of the global batch')


def _check_recipe(config, tables):
  for table in tables:
    table.check(config)
  for key in ('image_size', 'eval_image_size'):
    if config[key] and config[key] < 32:  # 0: the network's own.
      raise UserError(f'{key}={config[key]} is too small for the networks '
                      '(keras.applications takes 32 or more); use 32 or '
                      "more, or 0 for the network's own")
  if not 0.0 <= config.ema_decay < 1.0:
    raise UserError(f'ema_decay={config.ema_decay} must be in [0, 1); 0 is '
                    "off, 0.9999 is tensorflow/tpu's")
  for key in ('drop_connect_rate', 'dropout_rate'):
    if not 0.0 <= config[key] < 1.0:
      raise UserError(f'{key}={config[key]} must be in [0, 1)')
  _at_least({key: config[key] for key in (
      'mixup_alpha', 'cutmix_alpha', 'l2_weight_decay', 'weight_decay',
      'label_smoothing', 'warmup_epochs', 'grad_clip_norm')}, 0, ' (0 is off)')
  if config.base_learning_rate <= 0:
    raise UserError(f'base_learning_rate={config.base_learning_rate} must be '
                    'more than 0')
  freeze = config.freeze_backbone_epochs
  if freeze < 0:
    raise UserError(f'freeze_backbone_epochs={freeze} must be 0 or more')
  if freeze and not config.init_from:
    raise UserError(f'freeze_backbone_epochs={freeze} needs --config.'
                    'init_from: a frozen random backbone learns nothing')
  if freeze and freeze >= config.epochs:
    raise UserError(f'freeze_backbone_epochs={freeze} leaves no epoch of '
                    f'the {config.epochs} to train the whole model; use fewer')


def _check_input(config, tables):
  for table in tables:
    table.check(config)
  address = config.data_service
  if address and not _DATA_SERVICE.match(address):
    raise UserError(f'data_service={address!r}; expected grpc://HOST:PORT of '
                    "a dispatcher (python -m launch.data_service), or '' (off)")
  if address and config.deterministic_input:
    raise UserError('deterministic_input=True cannot hold through '
                    'data_service: batches arrive in whatever order the '
                    'workers make them; set one or the other')


def _check_schedule_of_work(config):
  """Intervals, retention, evaluation, export and recovery settings."""
  _at_least({key: config[key] for key in (
      'epochs', 'log_every_steps', 'checkpoint_every_steps',
      'keep_checkpoints', 'recovery_max_skipped_executions')}, 1)
  _at_least({'recovery_max_trials': config.recovery_max_trials}, 0)
  if config.eval_every_epochs < 0:
    raise UserError(f'eval_every_epochs={config.eval_every_epochs} must be '
                    '0 (only at the end) or more')
  _one_of('keep_best_metric', config.keep_best_metric, ('', *Metric),
          "'' (off), " + ', '.join(Metric))
  _one_of('export_tflite', config.export_tflite, TFLITE_WEIGHTS,
          "'' (off), float32, float16")
  for tracker in [n.strip() for n in config.tracking.split(',') if n.strip()]:
    if tracker not in set(Tracker):
      raise UserError(f'tracking={config.tracking!r}: unknown tracker '
                      f"{tracker!r}; accepted: '' (off), "
                      f"{', '.join(Tracker)}, or both comma-separated")
    if importlib.util.find_spec(tracker) is None:
      raise UserError(f'tracking={tracker} needs the {tracker} package: pip '
                      'install -r requirements-tracking.txt')
  missing = [name for name in ONNX_PACKAGES
             if importlib.util.find_spec(name) is None]
  if config.export_onnx and missing:
    raise UserError(f'export_onnx=True needs {", ".join(missing)}: pip '
                    'install -r requirements-onnx.txt, or export_onnx=False')
  profile_window(config.profile_steps)

