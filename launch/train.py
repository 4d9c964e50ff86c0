"""Train EfficientNet on whatever hardware this process finds.

  python -m launch.train                                   # offline CPU default
  python -m launch.train --tpu=local --workdir=gs://b/run  # Colab / TPU VM
  python -m launch.train --config.epochs=5 --policy=mixed_bfloat16
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import cli
from pipeline.run import plan as plan_lib
from pipeline.storage import workdir_lock
from pipeline.training import loop


def main(config):
  plan = plan_lib.resolve(config, cli.request(config))
  if cli.DRY_RUN.value:
    if plan.hardware.is_chief:
      workdir_lock.WorkdirLock(plan.workdir).check()
    print('dry run: everything checks out; the run would start')
    return
  loop.train_and_evaluate(plan)


if __name__ == '__main__':
  cli.run(main)
