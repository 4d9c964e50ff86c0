"""The prepared call for a lent GPU: the same kernels in every process,
the depthwise forms, and Keras' own model beside them, in one budget.

  python -m launch.gpu_call --out=$OUT/call --budget_s=510
  python -m launch.gpu_call --out=/tmp/call --budget_s=900 \\
      --image_size=32 --batch_size=16 --config.model=efficientnet_tiny  # a CPU

Runs launch.probe in fresh processes (pipeline/probe/gpu_call.py says
which, and why in that order); one line per step as it ends, the
summary last; OUT/call.json rewritten after every step. Needs JAX, Keras,
ml-collections and absl-py, as launch.probe does. Not launch.gpu_checks,
which checks the whole project on a user's GPU machine in 45 minutes.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/default.py', 'The recipe every probe process takes '
    '(--config.KEY=VALUE overrides pass through).')
_OUT = flags.DEFINE_string('out', 'runs/gpu-call', 'The call\'s folder.')
_BUDGET_S = flags.DEFINE_integer('budget_s', 510, 'Seconds for the call.')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 224, 'Pixels per side.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Global batch.')
_EXECUTIONS = flags.DEFINE_integer('executions', 10,
                                   'Timed executions per measurement.')
_STEPS = flags.DEFINE_integer('steps_per_execution', 8,
                              'Steps per compiled program call.')
_CLASSES = flags.DEFINE_integer('num_classes', 1000, 'Classes of the head.')
_ORDER = flags.DEFINE_list(
    'steps', None, 'The steps to run, in this order (default: every one, '
    'as pipeline/probe/gpu_call.py lists them).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from pipeline.probe import gpu_call  # pylint: disable=g-import-not-at-top
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  probe_flags = [f'--image_size={_IMAGE_SIZE.value}',
                 f'--batch_size={_BATCH_SIZE.value}',
                 f'--executions={_EXECUTIONS.value}',
                 f'--steps_per_execution={_STEPS.value}',
                 f'--num_classes={_CLASSES.value}',
                 '--config=' + config_flags.get_config_filename(
                     flags.FLAGS['config']),
                 # Overrides pass through to every probe process.
                 *[arg for arg in sys.argv[1:] if arg.startswith('--config.')]]
  order = _ORDER.value or gpu_call.ORDER
  unknown = set(order) - set(gpu_call.NAMES)
  if unknown:
    sys.exit(f'error: --steps: {", ".join(sorted(unknown))}; accepted: '
             f'{", ".join(gpu_call.NAMES)}')
  figures = gpu_call.run(out, _BUDGET_S.value, probe_flags, order,
                         report=lambda line: print(line, flush=True))
  print(f'gpu_call: done in {figures["elapsed_s"]} s; {out}/call.json')


if __name__ == '__main__':
  app.run(main)
