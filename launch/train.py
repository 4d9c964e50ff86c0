"""Train EfficientNet on whatever hardware this process finds.

  python -m launch.train                                   # offline CPU default
  python -m launch.train --tpu=local --workdir=gs://b/run  # Colab / TPU VM
  python -m launch.train --config.epochs=5 --policy=mixed_bfloat16
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from launch import cli
from pipeline.run import config_file
from pipeline.run import plan as plan_lib
from pipeline.storage import workdir_lock
from pipeline.training import loop

# --helpshort lists the flags every launcher takes from launch/cli.py too.
flags.adopt_module_key_flags(cli)
PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False, 'Resolve as --dry_run does, then print the '
    'config as resolved (what the data chose for the keys left open) as a '
    'Python file to pass back with --config=FILE; the plan goes to stderr.')


def main(config):
  dry_run = cli.DRY_RUN.value or PRINT_CONFIG.value
  plan = plan_lib.resolve(config, cli.request(config, dry_run=dry_run))
  if PRINT_CONFIG.value:
    print(config_file.text(plan, ' '.join(['python -m launch.train',
                                           *sys.argv[1:]])))
    return
  if dry_run:
    if plan.hardware.is_chief:
      workdir_lock.WorkdirLock(plan.workdir).check()
    print('dry run: everything checks out; the run would start')
    return
  loop.train_and_evaluate(plan)


if __name__ == '__main__':
  cli.run(main)
