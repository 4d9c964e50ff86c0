"""Flags shared by the launchers, and one-line errors for flag mistakes.

Importing this module defines --config (with --config.KEY=VALUE overrides),
the run flags (hardware, --policy, --xla, --workdir); `request()` turns them
into a plan.Request. Launchers call pipeline.environment.prepare(sys.argv)
before importing this module: it imports TensorFlow.
"""

import os
import re
import sys

from absl import flags
from ml_collections import config_flags
import tensorflow as tf

from pipeline import plan
from pipeline import precision
from pipeline.errors import first_line


def _config_path(argv):
  paths = [a.split('=', 1)[1] for a in argv if a.startswith('--config=')]
  return paths[-1] if paths else 'configs/default.py'


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
    sys.exit(f'FATAL Flags parsing error: {e}\n'
             'Pass --helpshort or --helpfull to see help on flags.')
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
except (AttributeError, KeyError, OSError) as e:
  sys.exit('error: ' + config_error(e, sys.argv))
WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Where checkpoints, logs, metrics and the export go; '
    'rerunning with the same workdir resumes. Default: runs/<model>_<dataset>.')
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
POLICY = flags.DEFINE_enum('policy', 'auto', precision.POLICIES,
                           'Precision policy; auto picks one per device.')
XLA = flags.DEFINE_enum('xla', 'auto', ['auto', 'on', 'off'],
                        'XLA compilation of the training step.')
COLLECTIVE = flags.DEFINE_enum(
    'collective', 'auto', ['auto', 'ring', 'nccl'],
    'All-reduce implementation across workers (TF_CONFIG runs): auto picks '
    'NCCL on GPUs, ring otherwise.')
COLLECTIVE_TIMEOUT_S = flags.DEFINE_float(
    'collective_timeout_s', 300.0,
    'A collective that waits longer for another worker fails the run.')
DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Resolve and check everything (hardware, policy, data, '
    'workdir access), print it, and stop before building the model.')
STAGING_DIR = flags.DEFINE_string(
    'staging_dir', '/tmp/pipeline-staging',
    'Local copy of a gs:// workdir: files are written here, then uploaded.')
NUM_CPU_DEVICES = flags.DEFINE_integer(
    'num_cpu_devices', 1, 'Split the host CPU into this many logical devices '
    '(a MirroredStrategy over them) to run multi-replica code without '
    'accelerators.')
ALLOW_CPU = flags.DEFINE_bool(
    'allow_cpu', False, 'Train on the CPU even though this machine has '
    'NVIDIA GPUs that TensorFlow cannot use (otherwise the run stops).')
# What launch.compare passes on to every run it starts.
HARDWARE_FLAGS = (TPU, TPU_ZONE, GCP_PROJECT, TPU_RUNTIME_VERSION, GPUS,
                  XLA, COLLECTIVE, COLLECTIVE_TIMEOUT_S, STAGING_DIR,
                  NUM_CPU_DEVICES, ALLOW_CPU)


def load_config():
  """The --config ConfigDict, or a one-line exit if its file did not load."""
  try:
    config = CONFIG.value
    config.get('model')  # A lazy value raises here if the file failed.
  except OSError as e:
    sys.exit('error: ' + config_error(e, sys.argv))
  return config


def request(config, workdir_default=True):
  """The plan.Request the flags ask for; no workdir if not `workdir_default`
  and --workdir is not given."""
  # tf.distribute logs every all-reduce it plans at INFO: noise, not progress.
  tf.get_logger().setLevel('WARNING')
  workdir = WORKDIR.value
  if workdir is None and workdir_default:
    workdir = os.path.join('runs', f'{config.model}_{config.dataset}')
  return plan.Request(
      workdir=workdir, staging_dir=STAGING_DIR.value, policy=POLICY.value,
      xla=XLA.value, tpu=TPU.value, tpu_zone=TPU_ZONE.value,
      gcp_project=GCP_PROJECT.value,
      tpu_runtime_version=TPU_RUNTIME_VERSION.value, gpus=GPUS.value,
      num_cpu_devices=NUM_CPU_DEVICES.value, collective=COLLECTIVE.value,
      collective_timeout_s=COLLECTIVE_TIMEOUT_S.value,
      allow_cpu=ALLOW_CPU.value)


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
