"""Compare whole runs, side by side: precision policies, progressive
learning's time to accuracy, or a race against the code a Keras user
would write.

  python -m launch.compare --policies=float32,mixed_bfloat16,rewrite
  python -m launch.compare --policies=float32,mixed_float16 \
      --double_batch_16bit --config=configs/cifar100.py
  python -m launch.compare --policies=float32,mixed_bfloat16,rewrite \
      --seeds=0,1,2     # accuracy parity: the table then shows seed means
  # Beside each policy, Keras' own model.fit of keras.applications' network
  # on the same input, optimizer and policy (launch.keras_fit):
  python -m launch.compare --policies=float32,mixed_bfloat16 --keras_fit \
      --config.image_size=128

Each run is its own `python -m launch.train` process under --workdir (default
runs/compare_<model>_<dataset>); --config, --config.KEY=VALUE and hardware
flags pass through to every run. Writes comparison.md, comparison.json and
comparison.png there; rerunning reuses finished runs and resumes the others.

  # Time to accuracy: the config as it is, then with progressive learning
  # (its progressive_stages, else the network's, else 2), each a whole run
  # evaluated each epoch, on a bundled set where resolution matters:
  python -m launch.compare --time_to_accuracy \
      --config.dataset=scattered_digits128 --config.model=efficientnet_tiny \
      --config.image_size=128 --config.epochs=24 \
      --config.progressive_stages=3 --config.progressive_first_image_size=48

  # A folder of photographs by the Keras example's code (EfficientNetB0 at
  # 224 px, image_dataset_from_directory, model.fit) and by this project's
  # defaults, on the same held-out images, each timed from its start:
  python -m launch.compare --against=keras --config.dataset=image_folder \
      --config.train_dir=photos/ --config.epochs=10
"""

import os
import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import tensorflow as tf

from launch import cli
from pipeline.data import sources
from pipeline.errors import UserError
from pipeline.reports import compare
from pipeline.reports.compare import race
from pipeline.reports.compare import time_to_accuracy
from pipeline.recipe import models
from pipeline.storage import workdirs


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
KERAS_FIT = flags.DEFINE_bool(
    'keras_fit', False, "Beside each policy's run (but rewrite), Keras' own "
    "model.fit of keras.applications' network on the same input, "
    'optimizer, schedule and policy (python -m launch.keras_fit), in '
    'keras_fit_<policy>/: images/s and final accuracy in the same table.')
TIME_TO_ACCURACY = flags.DEFINE_bool(
    'time_to_accuracy', False, 'Instead: train the config as it is and again '
    'with progressive learning (its progressive_stages, else 2), one after '
    "the other, and say how long each took to the fixed run's final "
    'accuracy; the runs go in --workdir, in fixed/ and progressive/.')
AGAINST = flags.DEFINE_enum(
    'against', None, [race.PEER], 'Instead: race the config on its image '
    "folder against the Keras example's code (keras: EfficientNetB0 at 224 "
    'px, image_dataset_from_directory, flip and rotation, Adam, model.fit), '
    'each run timed from its start and evaluated each epoch on the same '
    'held-out images; the runs go in --workdir, in keras/ and ours/.')
PEER_IMAGE_SIZE = flags.DEFINE_integer(
    'peer_image_size', race.PEER_IMAGE_SIZE, "With --against: the peer's "
    "image size (Keras' examples: EfficientNetB0's own 224).", lower_bound=32)


# --helpshort lists the flags every launcher takes from launch/cli.py
# too (after the policy lists cli.py defines for this launcher).
flags.adopt_module_key_flags(cli)

def main(config):
  if cli.POLICY.present or cli.DRY_RUN.present:
    raise UserError('launch.compare takes --policies=a,b (not --policy) and '
                    'has no --dry_run')
  if TIME_TO_ACCURACY.value and AGAINST.value:
    raise UserError('--time_to_accuracy and --against are two comparisons: '
                    'one at a time')
  root = cli.WORKDIR.value or f'runs/compare_{config.model}_{config.dataset}'
  if AGAINST.value:
    part = sources.SOURCES.of(config)
    if not isinstance(part, sources.ListedImages):
      raise UserError('--against races on images listed one by one, as '
                      "Keras' example reads them: --config.dataset="
                      'image_folder --config.train_dir=PATH (or a csv)')
    return _two_runs(root, lambda train_args: race.race(
        part.listed(sources.SOURCES.settings(config)), [
            a for a in train_args if not a.startswith(
                ('--config.dataset', '--config.train_dir', '--config.eval_dir',
             '--config.train_csv', '--config.eval_csv', '--config.epochs'))],
        root, config.epochs, PEER_IMAGE_SIZE.value))
  if TIME_TO_ACCURACY.value:
    stages = time_to_accuracy.stage_count(
        config.progressive_stages,
        models.MODELS[config.model].progressive_stages(config.model))
    return _two_runs(root, lambda train_args: time_to_accuracy.measure(
        train_args, stages, root))
  # The runs are child processes: this one must not take an accelerator.
  tf.config.set_visible_devices([], 'GPU')
  request = compare.Request(
      policies=POLICIES.value,
      seeds=compare.parse_seeds(SEEDS.value, config.seed),
      double_batch_16bit=DOUBLE_BATCH_16BIT.value,
      root=root,
      forwarded_args=cli.config_args() + cli.hardware_args(),
      command=('python', '-m', 'launch.compare', *sys.argv[1:]),
      keras_fit=KERAS_FIT.value)
  # A stop (SIGTERM, Ctrl-C) leaves the run in progress saved.
  return 0 if compare.run_comparison(request, config) else 1


def _two_runs(root, measure):
  """--time_to_accuracy or --against: `measure(launch.train's arguments)`
  runs both; their one line, and their figures in ROOT/comparison.json."""
  result = measure(cli.config_args() + cli.hardware_args())
  workdirs.write_json(os.path.join(root, 'comparison.json'), result)
  print(result['line'])
  print(f'written to {os.path.join(root, "comparison.json")}')


if __name__ == '__main__':
  cli.run(main)
