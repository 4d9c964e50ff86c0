"""Benchmark input, model ceiling and real training for a config.

  python -m launch.benchmark --config.image_size=224 --num_executions=5
  python -m launch.benchmark --config.dataset=tfrecord \
      --config.train_files='/tmp/jpeg/train-*' --config.eval_files='/tmp/jpeg/eval-*' \
      --config.num_classes=10 --config.image_size=224 --config.augment=inception

Prints a table and writes it as JSON (--output). Same hardware and config
flags as launch.train.
"""

import json
import sys

from pipeline import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from launch import cli
from pipeline import benchmark
from pipeline import plan
from pipeline.errors import UserError

_EXECUTIONS = flags.DEFINE_integer(
    'num_executions', 5, 'Timed calls of steps_per_execution steps each.')
_OUTPUT = flags.DEFINE_string('output', 'benchmark.json', 'Where the JSON goes.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  config = cli.load_config()
  try:
    run_plan = plan.resolve(config, cli.request(config, workdir_default=False))
    result = benchmark.run(config, run_plan, _EXECUTIONS.value)
  except UserError as e:
    sys.exit(f'error: {e}')
  print(benchmark.table(result))
  with open(_OUTPUT.value, 'w') as f:
    json.dump(result, f, indent=2)
  print(f'written to {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
