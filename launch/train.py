"""Train EfficientNet on whatever hardware this process finds.

  python -m launch.train                                   # offline CPU default
  python -m launch.train --tpu=local --workdir=gs://b/run  # Colab / TPU VM
  python -m launch.train --config.epochs=5 --policy=mixed_bfloat16
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app

from launch import cli
from pipeline.run import console
from pipeline.rules.machine import stopping
from pipeline.run import plan as plan_lib
from pipeline.training import loop
from pipeline.storage import workdir_lock
from pipeline.errors import Stopped
from pipeline.errors import UserError


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  console.setup()
  config = cli.load_config()
  try:
    plan = plan_lib.resolve(config, cli.request(config))
    if cli.DRY_RUN.value:
      if plan.hardware.is_chief:
        workdir_lock.WorkdirLock(plan.workdir).check()
      print('dry run: everything checks out; the run would start')
      return
    loop.train_and_evaluate(plan)
  except UserError as e:
    stopping.exit_with(1, f'error: {e}')
  except Stopped as e:  # SIGTERM or Ctrl-C, its checkpoint committed.
    stopping.exit_after(e)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
