"""Flags shared by the launchers, and one-line errors for flag mistakes.

Importing this module defines --config (with --config.KEY=VALUE overrides),
the hardware flags and --policy/--xla; `resolve_plan()` turns them into the
pipeline's Plan.
"""

import os
import re
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # Before TensorFlow loads.
# --policy=rewrite on CPU is oneDNN's bfloat16 rewrite. TensorFlow reads this
# switch once, as it loads, and leaves oneDNN off on CPUs without AVX-512.
if '--policy=rewrite' in sys.argv or ('--policy', 'rewrite') in zip(
    sys.argv, sys.argv[1:]):
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')

from absl import flags  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags
import tensorflow as tf

from pipeline import devices
from pipeline import precision
from pipeline import train


def config_error(error, argv):
  """One line for a config file that does not load or a key it lacks."""
  text = str(error).strip("'\" ")
  if isinstance(error, OSError):
    paths = [a.split('=', 1)[1] for a in argv if a.startswith('--config=')]
    return (f'config file {paths[-1] if paths else "?"!r} could not be loaded; '
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
  except (AttributeError, KeyError, OSError) as e:
    sys.exit('error: ' + config_error(e, argv))


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


def load_config():
  """The --config ConfigDict, or a one-line exit if its file did not load."""
  try:
    config = CONFIG.value
    config.get('model')  # A lazy value raises here if the file failed.
  except OSError as e:
    sys.exit('error: ' + config_error(e, sys.argv))
  return config


def resolve_plan(config):
  """Hardware, strategy, policy and XLA from the flags; may raise UserError."""
  # tf.distribute logs every all-reduce it plans at INFO: noise, not progress.
  tf.get_logger().setLevel('WARNING')
  workdir = WORKDIR.value or os.path.join(
      'runs', f'{config.model}_{config.dataset}')
  hardware = devices.resolve(TPU.value, TPU_ZONE.value, GCP_PROJECT.value,
                             NUM_CPU_DEVICES.value, COLLECTIVE.value,
                             COLLECTIVE_TIMEOUT_S.value, GPUS.value,
                             TPU_RUNTIME_VERSION.value)
  policy, policy_reason = precision.choose_policy(
      POLICY.value, hardware.device_kind, hardware.gpu_compute_capability,
      precision.cpu_has_amx())
  xla, xla_reason = train.choose_xla(XLA.value, hardware, policy)
  return train.Plan(hardware, policy, policy_reason, xla, xla_reason, workdir,
                    STAGING_DIR.value)
