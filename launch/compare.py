"""Train the same model and data under several precision policies, side by side.

  python -m launch.compare --policies=float32,mixed_bfloat16,rewrite
  python -m launch.compare --policies=float32,mixed_float16 \
      --double_batch_16bit --config=configs/cifar100.py
  python -m launch.compare --policies=float32,mixed_bfloat16,rewrite \
      --seeds=0,1,2     # accuracy parity: the table then shows seed means

Each run is its own `python -m launch.train` process under --workdir (default
runs/compare_<model>_<dataset>); --config, --config.KEY=VALUE and hardware
flags pass through to every run. Writes comparison.md, comparison.json and
comparison.png there; rerunning reuses finished runs and resumes the others.
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import tensorflow as tf

from launch import cli
from pipeline.errors import UserError
from pipeline.reports import compare

# --helpshort lists the flags every launcher takes from launch/cli.py too.
flags.adopt_module_key_flags(cli)

POLICIES = cli.define_policy_list(
    'policies', ['float32', 'mixed_bfloat16'],
    'Comma list of the policies to compare.')
SEEDS = flags.DEFINE_string(
    'seeds', '', 'Comma list of seeds, one run per policy and seed; empty: '
    'the config seed. With several, the table shows means.')
DOUBLE_BATCH_16BIT = flags.DEFINE_bool(
    'double_batch_16bit', False, 'Twice the global batch for 16-bit policies '
    '(half the activation memory), with half the steps: every run still sees '
    'the same examples.')


def main(config):
  if cli.POLICY.present or cli.DRY_RUN.present:
    raise UserError('launch.compare takes --policies=a,b (not --policy) and '
                    'has no --dry_run')
  # The runs are child processes: this one must not take an accelerator.
  tf.config.set_visible_devices([], 'GPU')
  request = compare.Request(
      policies=POLICIES.value,
      seeds=compare.parse_seeds(SEEDS.value, config.seed),
      double_batch_16bit=DOUBLE_BATCH_16BIT.value,
      root=cli.WORKDIR.value or f'runs/compare_{config.model}_'
      f'{config.dataset}',
      forwarded_args=cli.config_args() + cli.hardware_args(),
      command=('python', '-m', 'launch.compare', *sys.argv[1:]))
  # A stop (SIGTERM, Ctrl-C) leaves the run in progress saved.
  return 0 if compare.run_comparison(request, config) else 1


if __name__ == '__main__':
  cli.run(main)
