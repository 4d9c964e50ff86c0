"""Shared test setup: two logical CPU devices, a prepared digits data set.

The CPU is split before anything initialises TensorFlow's devices, so every
test in this process can build a real MirroredStrategy over 2 replicas.
"""

import os
import subprocess
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('NO_GCE_CHECK', 'true')

import pytest  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from pipeline import devices

devices.split_cpu(2)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def tfds_dir(tmp_path_factory):
  """A tfds data_dir with sklearn_digits prepared once per session."""
  from pipeline import data  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tfds'))
  data.load_source(ml_collections.ConfigDict(dict(
      dataset='sklearn_digits', data_dir=path, train_split='train',
      eval_split='')))
  return path


def run_train(*args, env=None, timeout=600):
  """Runs `python -m launch.train ARGS` in a fresh process."""
  full_env = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, '-m', 'launch.train', *args],
                        cwd=REPO, env=full_env, capture_output=True, text=True,
                        timeout=timeout, check=False)


def tiny_args(workdir, tfds_dir, *extra):
  """Flags for the smallest real run: B0 at 32 px on a slice of digits."""
  return (f'--workdir={workdir}', f'--config.data_dir={tfds_dir}',
          '--config.train_split=train[:256]', '--config.global_batch_size=32',
          '--config.epochs=2', '--config.steps_per_execution=4',
          '--config.log_every_steps=4', '--config.eval_every_epochs=0', *extra)


assert tf.config.list_logical_devices('CPU'), 'TensorFlow sees no CPU'
