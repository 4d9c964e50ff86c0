"""Train EfficientNet on whatever hardware this process finds.

  python -m launch.train                                   # offline CPU default
  python -m launch.train --tpu=local --workdir=gs://b/run  # Colab / TPU VM
  python -m launch.train --config.epochs=5 --policy=mixed_bfloat16
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # Before TensorFlow loads.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from ml_collections import config_flags
import tensorflow as tf

from launch import cli
from pipeline import devices
from pipeline import precision
from pipeline import train
from pipeline.errors import UserError

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                               'default.py')
try:
  # ml_collections loads the file and applies --config.KEY=VALUE right here.
  _CONFIG = config_flags.DEFINE_config_file(
      'config', _DEFAULT_CONFIG,
      'Config file; override fields with --config.KEY=VALUE.',
      lock_config=True)
except (AttributeError, KeyError, OSError) as e:
  sys.exit('error: ' + cli.config_error(e, sys.argv))
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Where checkpoints, logs, metrics and the export go; '
    'rerunning with the same workdir resumes. Default: runs/<model>_<dataset>.')
_TPU = flags.DEFINE_string(
    'tpu', '', "TPU name, 'local' (TPU VM, Colab) or grpc://host:port; "
    'empty: no TPU.')
_TPU_ZONE = flags.DEFINE_string('tpu_zone', None, 'Zone of a named TPU.')
_GCP_PROJECT = flags.DEFINE_string('gcp_project', None,
                                   'Project of a named TPU.')
_POLICY = flags.DEFINE_enum('policy', 'auto', precision.POLICIES,
                            'Precision policy; auto picks one per device.')
_XLA = flags.DEFINE_enum('xla', 'auto', ['auto', 'on', 'off'],
                         'XLA compilation of the training step.')
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    'num_cpu_devices', 1, 'Split the host CPU into this many logical devices '
    '(a MirroredStrategy over them) to run multi-replica code without '
    'accelerators.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  # tf.distribute logs every all-reduce it plans at INFO: noise, not progress.
  tf.get_logger().setLevel('WARNING')
  try:
    config = _CONFIG.value
    run_name = f'{config.model}_{config.dataset}'  # Loads a lazy --config.
  except OSError as e:
    sys.exit('error: ' + cli.config_error(e, sys.argv))
  workdir = _WORKDIR.value or os.path.join('runs', run_name)
  try:
    hardware = devices.resolve(_TPU.value, _TPU_ZONE.value, _GCP_PROJECT.value,
                               _NUM_CPU_DEVICES.value)
    policy, policy_reason = precision.choose_policy(
        _POLICY.value, hardware.device_kind, hardware.gpu_compute_capability,
        precision.cpu_has_amx())
    xla, xla_reason = train.choose_xla(_XLA.value, hardware)
    train.train_and_evaluate(config, train.Plan(
        hardware, policy, policy_reason, xla, xla_reason, workdir))
  except UserError as e:
    logging.flush()
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
