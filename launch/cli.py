"""Flags shared by the launchers, and one-line errors for flag mistakes.

Importing this module defines --config (with --config.KEY=VALUE overrides),
the run flags (hardware, --policy, --xla, --workdir); `request()` turns them
into a request_lib.Request. Launchers call
pipeline.run.environment.prepare(sys.argv) before importing this module: it
imports TensorFlow.
"""

import os
import re
import sys

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags
import tensorflow as tf

from pipeline import backends
from pipeline.rules.speed import precision
from pipeline.rules.config import validation
from pipeline.errors import Stopped
from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.rules.machine import stopping
from pipeline.run import console
from pipeline.rules.config import request as request_lib


def _config_path(argv):
  """The config file argv names (--config=FILE or --config FILE)."""
  paths = [a.split('=', 1)[1] if '=' in a else argv[i + 1]
           for i, a in enumerate(argv)
           if a.startswith('--config=') or (a == '--config' and
                                            i + 1 < len(argv))]
  return paths[-1] if paths else 'configs/default.py'


class _CompletingParser(flags.ArgumentParser):
  """ml_collections' config-file parser, then the keys the file omits
  filled from configs/default.py (before --config.KEY=VALUE overrides
  apply, so those keys can be overridden too)."""

  def __init__(self, loader):
    self._loader = loader

  def parse(self, argument):
    config = self._loader.parse(argument)
    if not isinstance(config, ml_collections.ConfigDict):
      return config  # ml_collections' stand-in for a file that did not load.
    config = validation.complete(config,
                                 source=f'config file {argument!r}')
    config.lock()
    return config

  def flag_type(self):
    return self._loader.flag_type()


def config_error(error, argv):
  """One line for a config file that does not load or a key it lacks."""
  text = str(error).strip("'\" ")
  if isinstance(error, SyntaxError):
    return (f'config file {error.filename or _config_path(argv)!r} line '
            f'{error.lineno}: {error.msg}; it must be a Python file with '
            'get_config()')
  if isinstance(error, OSError):
    return (f'config file {_config_path(argv)!r} could not be loaded; '
            'pass a Python file with get_config(), e.g. configs/default.py')
  key = re.match(r"[\\']*([\w.]+)", text)
  hint = re.search(r'Did you mean "([\w.]+)"', text)
  return (f'unknown config key {key.group(1) if key else text!r}'
          + (f' (did you mean {hint.group(1)!r}?)' if hint else '')
          + '; the keys are the fields of the config file, e.g. '
          'configs/default.py, set as --config.KEY=VALUE')


def parse_flags(argv):
  """absl's flag parsing, with config-file errors as one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    # A validator's message names its flag itself: absl's prefix (the
    # parsed value, as a Python list) would only repeat it.
    text = re.sub(r'^flag --(\w+)=.*?: (?=--\1\b)', '', str(e))
    sys.exit(f'error: {text} (--helpshort lists the flags)')
  except UserError as e:  # A key the config file has and the default lacks.
    sys.exit(f'error: {e}')
  except (AttributeError, KeyError, OSError, SyntaxError) as e:
    sys.exit('error: ' + config_error(e, argv))
  except Exception as e:  # pylint: disable=broad-except
    # Whatever a config file's own code raises while it loads.
    sys.exit(f'error: config file {_config_path(argv)!r} failed to load: '
             f'{type(e).__name__}: {first_line(e)}')


_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                               'default.py')
try:
  # ml_collections loads the file and applies --config.KEY=VALUE right here.
  CONFIG = config_flags.DEFINE_config_file(
      'config', _DEFAULT_CONFIG,
      'Config file; override fields with --config.KEY=VALUE.',
      lock_config=True)
  flags.FLAGS['config'].parser = _CompletingParser(
      flags.FLAGS['config'].parser)
except (AttributeError, KeyError, OSError) as e:
  sys.exit('error: ' + config_error(e, sys.argv))
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Where checkpoints, logs, metrics and the export go; '
    'rerunning with the same workdir resumes. Default: runs/<model>_<dataset>.')
ACCEPT_CHANGES = flags.DEFINE_list(
    'accept_changes', [], 'Settings (config keys, or policy) a rerun may '
    'change in the run its --workdir holds: it trains on from its last '
    'checkpoint under the new values, and run.json records each change; '
    'e.g. epochs, to extend a run. Any other change is refused (with '
    '--workdir) or trains in a workdir of its own (the default one).')
TPU = flags.DEFINE_string(
    'tpu', '', "TPU name, 'local' (TPU VM, Colab) or grpc://host:port; "
    'empty: no TPU.')
TPU_ZONE = flags.DEFINE_string('tpu_zone', None, 'Zone of a named TPU.')
GCP_PROJECT = flags.DEFINE_string('gcp_project', None,
                                  'Project of a named TPU.')
TPU_RUNTIME_VERSION = flags.DEFINE_string(
    'tpu_runtime_version', '', "TPU Nodes only: '' leaves the TPU's runtime "
    "as it is, 'match' switches it to this TensorFlow's version, or a "
    'version such as 2.12.0 (needs requirements-tpu-client.txt).')
GPUS = flags.DEFINE_string(
    'gpus', '', "GPUs for the MirroredStrategy, by index or name, e.g. '0,2'; "
    'empty: all visible GPUs.')
BACKEND = flags.DEFINE_enum(
    'backend', 'auto', backends.BACKENDS,
    "Keras' backend: auto picks JAX where a TPU is asked for or attached "
    "and no TensorFlow TPU build is installed, TensorFlow otherwise.")
POLICY = flags.DEFINE_enum('policy', request_lib.Request.policy, precision.POLICIES,
                           'Precision policy; auto picks one per device.')
XLA = flags.DEFINE_enum('xla', request_lib.Request.xla, ['auto', 'on', 'off'],
                        'XLA compilation of the training step.')
COLLECTIVE = flags.DEFINE_enum(
    'collective', request_lib.Request.collective, ['auto', 'ring', 'nccl'],
    'All-reduce implementation across workers (TF_CONFIG runs): auto picks '
    'NCCL on GPUs, ring otherwise.')
COLLECTIVE_TIMEOUT_S = flags.DEFINE_float(
    'collective_timeout_s', request_lib.Request.collective_timeout_s,
    'A collective that waits longer for another worker fails the run.')
DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Resolve and check everything (hardware, policy, data, '
    'workdir access), print it, and stop before building the model.')
STAGING_DIR = flags.DEFINE_string(
    'staging_dir', request_lib.Request.staging_dir,
    'Local copy of a gs:// workdir: files are written here, then uploaded.')
NUM_CPU_DEVICES = flags.DEFINE_integer(
    'num_cpu_devices', request_lib.Request.num_cpu_devices,
    'Split the host CPU into this many logical devices '
    '(a MirroredStrategy over them) to run multi-replica code without '
    'accelerators.')
SPLIT_GPUS = flags.DEFINE_integer(
    'split_gpus', request_lib.Request.split_gpus,
    'Split each GPU into this many logical GPUs, each with an equal share of '
    'its memory, so MirroredStrategy runs that many replicas on one card: '
    'multi-GPU code measured on one GPU (TensorFlow only).')
WORKDIR_LEASE_S = flags.DEFINE_float(
    'workdir_lease_s', request_lib.Request.workdir_lease_s,
    'A gs:// workdir is held by a lease its run renews; one not renewed for '
    'this long has lapsed, and the next run takes it over.')
ALLOW_CPU = flags.DEFINE_bool(
    'allow_cpu', False, 'Train on the CPU even though this machine has '
    'NVIDIA GPUs that TensorFlow cannot use (otherwise the run stops).')
# What launch.compare passes on to every run it starts.
HARDWARE_FLAGS = (BACKEND, TPU, TPU_ZONE, GCP_PROJECT, TPU_RUNTIME_VERSION, GPUS,
                  XLA, COLLECTIVE, COLLECTIVE_TIMEOUT_S, STAGING_DIR,
                  NUM_CPU_DEVICES, SPLIT_GPUS, ALLOW_CPU, WORKDIR_LEASE_S)


def define_policy_list(name, default, help_text, required=True,
                       flag_values=flags.FLAGS):
  """A comma-list flag of precision policies to run side by side, checked
  by absl as it parses: known names, no 'auto', none twice; empty only if
  not `required`."""
  accepted = ', '.join(p for p in precision.POLICIES if p != 'auto')

  def check(names):
    if not names and required:
      raise flags.ValidationError(f'--{name} names no policy; accepted: '
                                  f'{accepted}')
    for policy in names:
      if policy == 'auto':
        raise flags.ValidationError(
            f"--{name}: 'auto' picks a different policy per device; name "
            f'the policies; accepted: {accepted}')
      if policy not in precision.POLICIES:
        raise flags.ValidationError(f'--{name}: unknown policy {policy!r}; '
                                    f'accepted: {accepted}')
    if len(set(names)) < len(names):
      raise flags.ValidationError(f'--{name} names a policy twice')
    return True

  holder = flags.DEFINE_list(name, default, f'{help_text} Accepted: '
                             f'{accepted}.', flag_values=flag_values)
  flags.register_validator(name, check, flag_values=flag_values)
  return holder


def run(main):
  """Runs a launcher's `main(config)` as each launcher with a config opens
  and ends: stray arguments refused, the console set up (the run's own
  lines and warnings, other libraries' INFO kept out), the config loaded
  (one line for a file that does not), and a UserError or a stop (SIGTERM,
  Ctrl-C: whatever was in progress saved) ending the process in one line.
  `main` returns the exit status (None: 0); the process then ends without
  Python's teardown (stopping.end_finished)."""

  def absl_main(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    console.setup()
    config = load_config()
    try:
      status = main(config)
    except UserError as e:
      stopping.exit_with(1, f'error: {e}')
    except Stopped as e:
      stopping.exit_after(e)
    stopping.end_finished(status or 0)

  app.run(absl_main, flags_parser=parse_flags)


def load_config():
  """The --config ConfigDict, or a one-line exit if its file did not load."""
  try:
    config = CONFIG.value
    config.model  # pylint: disable=pointless-statement  # ml_collections' stand-in for a file that did not load raises here.
  except OSError as e:
    sys.exit('error: ' + config_error(e, sys.argv))
  return config


def request(config, workdir_default=True, dry_run=False):
  """The request_lib.Request the flags ask for; no workdir if not `workdir_default`
  and --workdir is not given; `dry_run`: resolve, write nothing."""
  # tf.distribute logs every all-reduce it plans at INFO: noise, not progress.
  tf.get_logger().setLevel('WARNING')
  workdir = WORKDIR.value
  default_workdir = workdir is None and workdir_default
  if default_workdir:
    workdir = os.path.join('runs', f'{config.model}_{config.dataset}')
  return request_lib.Request(
      workdir=workdir, default_workdir=default_workdir,
      accept_changes=tuple(ACCEPT_CHANGES.value),
      staging_dir=STAGING_DIR.value, policy=POLICY.value,
      xla=XLA.value, tpu=TPU.value, tpu_zone=TPU_ZONE.value,
      gcp_project=GCP_PROJECT.value,
      tpu_runtime_version=TPU_RUNTIME_VERSION.value, gpus=GPUS.value,
      num_cpu_devices=NUM_CPU_DEVICES.value, split_gpus=SPLIT_GPUS.value,
      collective=COLLECTIVE.value,
      collective_timeout_s=COLLECTIVE_TIMEOUT_S.value,
      allow_cpu=ALLOW_CPU.value, workdir_lease_s=WORKDIR_LEASE_S.value,
      input_pipeline=config.input_pipeline, dry_run=dry_run)


def config_args():
  """--config=FILE and its --config.KEY=VALUE overrides, as parsed."""
  flag = flags.FLAGS['config']
  overrides = config_flags.get_override_values(flag)
  given = ([f'--config={config_flags.get_config_filename(flag)}']
           if flag.present else [])
  return given + [f'--config.{key}={_flag_value(value)}'
                  for key, value in sorted(overrides.items())]


def hardware_args():
  """The hardware flags given on the command line, as arguments."""
  return [holder.serialize() for holder in HARDWARE_FLAGS if holder.present]


def _flag_value(value):
  return str(value).lower() if isinstance(value, bool) else str(value)
