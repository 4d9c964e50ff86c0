"""A user's TFRecord directory, end to end: export, train, benchmark."""

import json
import math
import re

import pytest

from conftest import run_module, run_train
from pipeline.data.sources.tfrecord import records as tfrecords
from test_console import ABSL_INFO


@pytest.fixture(scope='module')
def jpeg_dir(tmp_path_factory, tfds_dir):
  """Digits as JPEG TFRecords with ImageNet's 1-based labels, plus a bad file."""
  root = tmp_path_factory.mktemp('jpeg')
  result = run_module('launch.make_tfrecords', f'--output_dir={root}',
                      f'--data_dir={tfds_dir}', '--splits=train[:256],test',
                      '--num_files=3', '--label_offset=1', '--image_size=40')
  assert result.returncode == 0, result.stderr[-2000:]
  tfrecords.write(str(root / 'train-bad'),
                  [tfrecords.serialize(b'\xff\xd8 truncated jpeg', 3)])
  return root


def _tfrecord_flags(root):
  """The files, on B0's code at a fraction of its size (the reading is
  tested, not the network)."""
  return ('--config.dataset=tfrecord', f'--config.train_files={root}/train-*',
          f'--config.eval_files={root}/eval-*', '--config.num_classes=10',
          '--config.label_offset=1', '--config.model=efficientnet_tiny')


# A whole training run: the slow tier keeps the fast suite in 12 min.
# TFRecord reading and skip counts are also unit-tested in
# tests/test_data.py, and the slow fine-tuning test trains on TFRecords.
@pytest.mark.slow
def test_training_on_tfrecord_files(jpeg_dir, tmp_path):
  workdir = tmp_path / 'run'
  result = run_train(*_tfrecord_flags(jpeg_dir), f'--workdir={workdir}',
                     '--config.global_batch_size=32', '--config.epochs=2',
                     '--config.steps_per_execution=4',
                     '--config.log_every_steps=4')
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['dataset'] == 'tfrecord'
  assert metrics['skipped_records'] == 1  # Counted once: the cache holds it.
  assert 0.0 <= metrics['input_wait_fraction'] < 1.0
  assert metrics['total_steps'] == 2 * (257 // 32)  # Records, bad one included.
  assert metrics['eval_examples'] == 359
  assert 'skipped records 1' in result.stderr


# A whole training run: the slow tier keeps the fast suite in 12 min.
@pytest.mark.slow
def test_label_offset_mistake_is_one_line(jpeg_dir, tmp_path):
  flags = [f for f in _tfrecord_flags(jpeg_dir) if 'label_offset' not in f]
  result = run_train(*flags, '--config.label_offset=0',
                     f'--workdir={tmp_path / "run"}',
                     '--config.global_batch_size=32', '--config.epochs=1')
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr[-2000:]
  assert 'label 10 (after label_offset=0) in ' in errors[0]
  assert 'outside [0, 10)' in errors[0]


def test_missing_files_pattern_is_one_line(tmp_path):
  pattern = f'{tmp_path}/none-*'
  result = run_train('--config.dataset=tfrecord',
                     f'--config.train_files={pattern}',
                     f'--config.eval_files={pattern}',
                     '--config.num_classes=10', f'--workdir={tmp_path / "w"}')
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert f"error: no file matches '{pattern}'" in result.stderr


@pytest.mark.slow
def test_benchmark_prints_three_throughputs(jpeg_dir, tmp_path):
  output = tmp_path / 'bench.json'
  result = run_module('launch.benchmark', *_tfrecord_flags(jpeg_dir),
                      '--config.global_batch_size=16',
                      '--config.steps_per_execution=2',
                      '--config.augment=inception', '--num_executions=2',
                      f'--output={output}')
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(output.read_text())
  for key in ('input_cold_images_per_sec', 'input_warm_images_per_sec',
              'input_images_per_sec_per_core', 'reference_input_images_per_sec',
              'train_synthetic_images_per_sec', 'train_real_images_per_sec',
              'train_slow_input_images_per_sec', 'overlap_wall_vs_sum',
              'compile_s'):
    assert figures[key] > 0, key
  rounds = list(zip(figures['input_rounds_images_per_sec'],
                    figures['reference_rounds_images_per_sec']))
  assert len(rounds) == 3
  assert figures['input_vs_reference'] == pytest.approx(
      sorted(o / r for o, r in rounds)[1])
  for row in ('input alone, first pass (cache: decoded)',
              'input alone, second pass', 'per core (',
              'reference input (tensorflow/tpu)', 'train, synthetic on device',
              'train, real input', 'input / reference preprocessing: ',
              'input as slow as the model: wall time '):
    assert row in result.stdout
  # TensorFlow's environment has no jaxlib to read XLA's cost analysis.
  assert ("FLOPs per image: none (XLA's cost analysis is read through "
          'jaxlib, which is not installed here') in result.stdout


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_benchmark_of_the_input_alone_against_a_target(jpeg_dir, tmp_path):
  output = tmp_path / 'bench.json'
  result = run_module('launch.benchmark', *_tfrecord_flags(jpeg_dir),
                      '--config.global_batch_size=16', '--config.cache=',
                      '--config.augment=inception', '--input_only',
                      '--target_images_per_sec=1e7', f'--output={output}')
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(output.read_text())
  assert figures['cache'] == 'none' and 'compile_s' not in figures
  assert figures['reference_input_images_per_sec'] > 0
  assert 'reference input (tensorflow/tpu)' in result.stdout
  assert 'input / reference preprocessing: ' in result.stdout
  assert figures['input_feeds_target'] is False
  assert figures['cores_for_target'] == math.ceil(
      1e7 / figures['input_images_per_sec_per_core'])
  assert (f'target 10000000 images/s: NOT fed by these {figures["cores"]} '
          f'cores; at this rate it needs {figures["cores_for_target"]} cores'
          in result.stdout)
  assert 'train, ' not in result.stdout
  # The plan's lines in the console's own format, none in absl's, and
  # none of libjpeg's on the damaged record (no run.log here: dropped).
  assert re.search(r'^\d\d:\d\d:\d\d Run: CPU', result.stderr, re.M)
  assert not ABSL_INFO.search(result.stderr), result.stderr[-3000:]
  assert 'Input file read error' not in result.stderr


def test_max_side_stores_each_photograph_within_it_aspect_kept(tmp_path):
  """--max_side: the longer side at most N, the aspect kept, JPEG at
  --quality; a smaller image only re-encoded where it is no JPEG."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  full, small = tmp_path / 'full', tmp_path / 'small'
  for root, extra in ((full, ()), (small, ('--max_side=160', '--quality=80'))):
    result = run_module('launch.make_tfrecords', '--dataset=photos',
                        '--num_examples=12', '--num_files=2',
                        f'--output_dir={root}', *extra)
    assert result.returncode == 0, result.stderr[-2000:]
  shapes = {}
  for root in (full, small):
    records = tf.data.TFRecordDataset(sorted(map(str, root.glob('train-*'))))
    shapes[root] = [tuple(tf.io.decode_jpeg(tfrecords.parse(r)[0]).shape[:2])
                    for r in records]
  assert len(shapes[full]) == len(shapes[small]) == 12
  for (height, width), (h, w) in zip(shapes[full], shapes[small]):
    assert max(height, width) > 160 and max(h, w) == 160
    assert abs(height / width - h / w) < 0.02, ((height, width), (h, w))
  jpeg = tfrecords.bounded(tf.io.encode_png(tf.zeros((20, 30, 3), tf.uint8))
                           .numpy(), 160, 90)
  assert tf.io.is_jpeg(jpeg) and tf.io.decode_jpeg(jpeg).shape == (20, 30, 3)
