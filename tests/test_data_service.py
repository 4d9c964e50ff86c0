"""The training input through tf.data service: a real dispatcher and two
real workers (in this process for the fast case, as separate processes
started by launch.data_service for the slow end-to-end run)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from configs import default
from pipeline.data import inputs
from pipeline.data import data_service
from pipeline.data import sources
from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.data.input_spec import InputSpec
from tests.conftest import REPO
from tests.conftest import free_port
from tests.conftest import run_train
from tests.conftest import tiny_args


def _tfrecord_config(root, **overrides):
  config = default.get_config()
  config.update(image_size=32, augment='translate')
  config.update(dict(dataset='tfrecord', train_files=str(root / 'train-*'),
                     eval_files=str(root / 'train-*'), num_classes=4,
                     image_size=32, augment='inception'), **overrides)
  return config


def _write_set(root):
  """16 JPEGs whose brightness encodes the label, and one bad record."""
  records = [tfrecords.serialize(tf.io.encode_jpeg(
      np.full((40, 48, 3), 40 + 50 * (i % 4), np.uint8)).numpy(), i % 4)
             for i in range(16)]
  records.insert(7, tfrecords.serialize(b'not an image', 1))
  tfrecords.write(str(root / 'train-0'), records)


def test_training_input_through_a_dispatcher_and_two_workers(tmp_path):
  _write_set(tmp_path)
  dispatcher = tf.data.experimental.service.DispatchServer()
  address = dispatcher.target.removeprefix('grpc://')
  workers = [data_service.start_worker(free_port(), address)
             for _ in range(2)]
  config = _tfrecord_config(tmp_path, data_service=dispatcher.target)
  source = sources.load_source(config)
  dataset = inputs.train_input_fn(InputSpec.of(config), source, 8,
                                  service_job='test')(
                                      tf.distribute.InputContext())
  # The service hands out whichever worker's batch is ready: a worker that
  # started late (a loaded machine) may be read from only after hundreds of
  # the other's. Batches are read until both workers' first passes have
  # come, then 100 more.
  skipped, after_both = 0, None
  for index, (images, labels, counts) in enumerate(dataset.take(3000)):
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.uint8
    # Crops of a flat image keep its brightness: image and label together.
    assert np.allclose(images.numpy().mean((1, 2, 3)),
                       40 + 50 * labels.numpy(), atol=3)
    skipped += int(tf.reduce_sum(counts))
    if skipped >= 2 and after_both is None:
      after_both = index + 100
    if index == after_both:
      break
  # Both workers run the job (else the pipeline ran here); each streams the
  # whole set and counts its one bad record once, on its cached first pass
  # (its first two batches), never on the passes after; the counts reach
  # the trainer inside the batches.
  assert [w._num_tasks() for w in workers] == [1, 1]  # pylint: disable=protected-access
  assert after_both is not None and skipped == 2, skipped


@pytest.mark.slow
def test_a_run_reads_through_a_local_dispatcher_and_two_workers(tmp_path,
                                                                 tfds_dir):
  port = free_port()
  started = [subprocess.Popen(
      [sys.executable, '-m', 'launch.data_service', *args], cwd=REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for args in (
                 ['--role=dispatcher', f'--port={port}'],
                 ['--role=worker', f'--port={free_port()}',
                  f'--dispatcher=localhost:{port}'],
                 ['--role=worker', f'--port={free_port()}',
                  f'--dispatcher=localhost:{port}'])]
  try:
    time.sleep(10)  # TensorFlow's import; the trainer retries meanwhile.
    assert all(p.poll() is None for p in started)
    result = run_train(*tiny_args(str(tmp_path / 'run'), tfds_dir,
                                  f'--config.data_service=grpc://localhost:{port}',
                                  '--config.export=true'))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f'training input from tf.data service grpc://localhost:{port}'
            in result.stderr)
    metrics = json.loads((tmp_path / 'run' / 'metrics.json').read_text())
    assert metrics['train_steps'] == metrics['total_steps'] == 16
    assert metrics['eval_accuracy'] is not None
  finally:
    for process in started:
      process.terminate()
      process.wait(timeout=30)
  assert os.path.exists(tmp_path / 'run' / 'export')
