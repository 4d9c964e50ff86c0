"""NVIDIA DALI input (data/dali/), on this CPU (DALI decoding CPU-only).

The rules (the choice, the index, the one-line refusals) run everywhere;
what needs DALI runs in the environment that has it (CI's JAX environment:
requirements-jax-test.txt and requirements-dali-tf.txt), where DALI's
pipelines are compared with tf.data's on the same files: the crops'
statistics, evaluation's images, disjoint shards, and whole runs on both
backends. No GPU here: 'mixed' (nvJPEG) decoding is BUILD_NOTES.md's.
"""

import io
import json
import os
import re
import types

import numpy as np
from PIL import Image
import pytest

from configs import default
import tensorflow as tf

from conftest import run_module, run_train
from pipeline.data import augmentations
from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.data import sources
from pipeline.data.dali import index as dali_index
from pipeline.data import decode
from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.errors import UserError
from pipeline.data.input_spec import InputSpec

try:  # Two CPU devices for JAX's mesh, set before JAX starts (collection).
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_num_cpu_devices', 2)
except ImportError:  # The TensorFlow environment: JAX's tests skip.
  jax = None

needs_dali = pytest.mark.skipif(
    not dali.installed(), reason='DALI runs in the JAX environment (CI)')


def _config(**overrides):
  """The default config (every key), set for DALI on TFRecord files."""
  config = default.get_config()
  config.update(input_pipeline='dali', dataset='tfrecord',
                train_files='/data/train-*', eval_files='/data/eval-*',
                image_size=224, eval_image_size=224, augment='inception')
  config.update(overrides)
  return config


def _choose(config, *args):
  """input_pipeline_lib.choose for `config` with its source as a run loads it: a
  tfrecord set's files, or another source's (no record files)."""
  files = ({'train': (config.train_files,), 'eval': (config.eval_files,)}
           if config.dataset == 'tfrecord' else {})
  source = sources.Source(config.dataset, 10, 64, 16, None, None,
                          record_files=files)
  return input_pipeline_lib.choose(config.input_pipeline,
                                   InputSpec.of(config), source,
                                   *args)


def _png(array):
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format='PNG')
  return buffer.getvalue()


def _write(path, images, labels):
  tfrecords.write(str(path), [tfrecords.serialize(_png(image), int(label))
                              for image, label in zip(images, labels)])
  return str(path)


def _input(files, training, batch, size, num_classes, augment='none',
           examples=None, staging=None):
  files = tuple(files)
  return dali.Input(
      files=files, indices=tuple(dali_index.indices(
          files, staging or os.path.dirname(files[0]))),
      training=training, global_batch_size=batch,
      num_examples=examples or sum(1 for f in files
                                   for _ in tf.data.TFRecordDataset(f)),
      image_size=size, num_classes=num_classes, label_offset=0,
      augmentation=augmentations.AUGMENTATIONS[augment],
      randaugment=augmentations.RandAugment(2, 15.0),
      central_fraction=1.0, shuffle_buffer=64, seed=1,
      num_threads=2)


def _run(pipeline, batches):
  """`batches` of (images, labels) as numpy from a CPU pipeline."""
  pipeline.build()
  out = [pipeline.run() for _ in range(batches)]
  return (np.concatenate([np.array(o[0].as_tensor()) for o in out]),
          np.concatenate([np.array(o[1].as_tensor()) for o in out]))


# --- the choice and its one-line refusals (no DALI needed) --------------------


TF_DATA, DALI = input_pipeline_lib.Pipeline.TF_DATA, input_pipeline_lib.Pipeline.DALI


def test_tf_data_stays_the_default_and_auto_takes_dali_only_where_measured():
  assert _choose(_config(input_pipeline='tf.data'), 'GPU')[0] is TF_DATA
  assert _choose(_config(input_pipeline='auto'), 'CPU') == (
      TF_DATA, 'auto: DALI pays on GPUs only (its CPU decoding is slower)')
  if dali.installed():
    pipeline, reason = _choose(_config(input_pipeline='auto'), 'GPU')
    assert pipeline is TF_DATA and '--input_only --save_policy' in reason
    pipeline, reason = _choose(_config(input_pipeline='auto'), 'GPU',
                                   {'dali': 9000.0, 'tf.data': 6689.0})
    assert (pipeline, reason) == (
        DALI, 'auto: measured faster on this GPU (dali 9,000, tf.data '
        '6,689 img/s)')
    assert _choose(_config(input_pipeline='auto'), 'GPU',
                       {'dali': 5000.0, 'tf.data': 6689.0})[0] is TF_DATA
    # Measured faster, but this config needs tf.data: it says why.
    pipeline, reason = _choose(
        _config(input_pipeline='auto', mixup_alpha=0.2), 'GPU',
        {'dali': 9000.0, 'tf.data': 6689.0})
    assert pipeline is TF_DATA and 'mixup and CutMix run in tf.data' in reason
    assert _choose(_config(), 'CPU') == (
        DALI, 'as configured; decoding on the CPU (no GPU)')


@pytest.mark.parametrize('overrides, message', [
    (dict(input_pipeline='nvjpeg'),
     "--config.input_pipeline='nvjpeg': expected auto, tf.data or dali"),
    (dict(dataset='cifar100'), 'DALI reads TFRecord files: '
     '--config.dataset=tfrecord (write them with launch.make_tfrecords)'),
    (dict(cutmix_alpha=1.0), 'mixup and CutMix run in tf.data'),
    (dict(data_service='grpc://d:5050'), 'a tf.data service runs tf.data'),
    (dict(augment='inception_autoaugment'), 'AutoAugment '
     '(augment=inception_autoaugment) runs in tf.data'),
    (dict(progressive_stages=2), 'progressive learning rebuilds the input at '
     "each stage's size, which tf.data does"),
    (dict(augment='inception_randaugment', randaugment_magnitude=7.5),
     'its RandAugment takes whole magnitudes, not randaugment_magnitude=7.5'),
    (dict(train_files='gs://b/train-*'), 'DALI reads local files, not '
     'gs://b/train-*'),
    (dict(eval_image_size=288), 'its pipelines evaluate at the training '
     'size, not eval_image_size=288: set --config.eval_image_size=224, or '
     '--config.input_pipeline=tf.data'),
])
def test_what_dali_cannot_run_is_one_line(overrides, message, monkeypatch):
  monkeypatch.setattr(dali, 'installed', lambda: True)
  with pytest.raises(UserError, match=re.escape(message)):
    _choose(_config(**overrides), 'GPU')


def test_without_dali_the_option_names_the_file_to_install(monkeypatch):
  # Where DALI is installed, a stand-in for a machine without it.
  monkeypatch.setattr(dali, 'installed', lambda: False)
  with pytest.raises(UserError, match=re.escape(
      'DALI is not installed; pip install -r requirements-gpu.txt')):
    _choose(_config(), 'GPU')
  assert _choose(_config(input_pipeline='auto'), 'GPU') == (
      TF_DATA, 'auto: DALI is not installed')


def test_saved_measurements_are_read_back_and_bad_ones_passed_over(
    tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert input_pipeline_lib.saved_rates('NVIDIA H100 80GB HBM3') is None
  path = input_pipeline_lib.save_rates('NVIDIA H100 80GB HBM3',
                         {'dali': 9000.0, 'tf.data': 6689.0})
  assert input_pipeline_lib.saved_rates('NVIDIA H100 80GB HBM3') == {'dali': 9000.0,
                                                       'tf.data': 6689.0}
  assert input_pipeline_lib.saved_rates('Tesla T4') is None  # Another GPU model.
  with open(path, 'w') as f:
    f.write('{"images_per_sec": 3')
  assert input_pipeline_lib.saved_rates('NVIDIA H100 80GB HBM3') is None


# --- the index (no DALI needed) -----------------------------------------------


def _digits(n, seed=0):
  rng = np.random.RandomState(seed)
  return rng.randint(0, 256, (n, 20, 24, 3)).astype(np.uint8)


def test_an_index_is_built_once_beside_the_data_and_rebuilt_when_stale(
    tmp_path):
  data = _write(tmp_path / 'train-0', _digits(5), range(5))
  [index] = dali_index.indices([data], str(tmp_path / 'staging'))
  assert index == str(tmp_path / '.dali_index' / 'train-0.idx')
  lines = open(index).read().splitlines()
  assert len(lines) == 5
  offsets = [tuple(map(int, line.split())) for line in lines]
  assert sum(length for _, length in offsets) == os.path.getsize(data)
  # Reused: not written again.
  stamp = os.stat(index).st_mtime_ns
  assert dali_index.indices([data], str(tmp_path / 'staging')) == [index]
  assert os.stat(index).st_mtime_ns == stamp
  # The file rewritten (newer than its index): rebuilt.
  _write(tmp_path / 'train-0', _digits(3), range(3))
  os.utime(data, (os.stat(index).st_mtime + 5,) * 2)
  dali_index.indices([data], str(tmp_path / 'staging'))
  assert len(open(index).read().splitlines()) == 3
  # A glob of the folder's files passes over the index folder.
  assert tfrecords.list_files(str(tmp_path / '*')) == [data]


def test_an_index_goes_to_the_staging_folder_where_the_data_is_read_only(
    tmp_path, monkeypatch):
  data = _write(tmp_path / 'train-0', _digits(2), range(2))
  # This machine runs as root, which may write anywhere: a stand-in for
  # a folder the user cannot write.
  monkeypatch.setattr(os, 'access', lambda path, mode: False)
  [index] = dali_index.indices([data], str(tmp_path / 'staging'))
  assert index.startswith(str(tmp_path / 'staging' / 'dali_index'))
  assert not os.path.exists(tmp_path / '.dali_index')


def test_a_file_cut_short_keeps_the_records_before_the_damage(tmp_path):
  data = _write(tmp_path / 'train-0', _digits(4), range(4))
  with open(data, 'r+b') as f:
    f.truncate(os.path.getsize(data) - 10)
  [index] = dali_index.indices([data], str(tmp_path))
  assert len(open(index).read().splitlines()) == 3
  with open(tmp_path / 'notes.txt', 'w') as f:
    f.write('hi')
  with pytest.raises(UserError, match='notes.txt has no readable record'):
    dali_index.indices([str(tmp_path / 'notes.txt')], str(tmp_path))


@needs_dali
def test_the_index_is_what_dalis_own_script_writes(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  data = _write(tmp_path / 'train-0', _digits(6), range(6))
  [index] = dali_index.indices([data], str(tmp_path))
  theirs = str(tmp_path / 'theirs.idx')
  subprocess.run([os.path.join(os.path.dirname(sys.executable),
                               'tfrecord2idx'), data, theirs], check=True)
  assert open(index).read().split() == open(theirs).read().split()


# --- DALI's pipelines against tf.data's, on the same files --------------------


def _gradient(side=200):
  """A PNG whose red channel is x and green is y, 0-255 across the image:
  a crop's colour ranges are its window."""
  x, y = np.meshgrid(np.linspace(0, 255, side), np.linspace(0, 255, side))
  return np.stack([x, y, np.zeros_like(x)], -1).round().astype(np.uint8)


def _windows(crops):
  """(area fraction, aspect ratio) of each crop of a square gradient."""
  red, green = crops[..., 0].astype(float), crops[..., 1].astype(float)
  width = (red.max((1, 2)) - red.min((1, 2))) / 255
  height = (green.max((1, 2)) - green.min((1, 2))) / 255
  return width * height, width / height


@needs_dali
def test_dalis_inception_crops_have_the_statistics_of_tf_datas(tmp_path):
  draws, image = 2048, _gradient()
  path = _write(tmp_path / 'train-0', [image] * 8, [0] * 8)
  crops, _ = _run(_input([path], True, 64, 48, 1,
                         augment='inception').pipeline(0, 1, None),
                  draws // 64)
  encoded = tf.constant(_png(image))
  tf.random.set_seed(0)  # Both draws seeded (DALI's by _input): repeatable.
  theirs = np.stack([decode.decode_window(encoded, decode.random_window,
                                          decode.square(48)).numpy()
                     for _ in range(draws)])
  area, aspect = _windows(crops)
  their_area, their_aspect = _windows(theirs)
  # The same ranges: area 8-100% (tf.data also rejects boxes under 10%:
  # min_object_covered=0.1), aspect 3/4-4/3, 10 attempts. Not the same
  # sampling: tf.data draws the crop's height uniformly, DALI its area (as
  # torchvision does), so DALI's crops are larger by 0.04-0.10 of the image
  # at each quartile. Here (2,048 draws each, seeded): mean area 0.46
  # against 0.40, quartiles 0.27/0.46/0.65 against 0.21/0.37/0.57; aspect
  # means 1.02 and 1.04. Unseeded, tf.data's mean ran 0.40-0.42.
  assert area.min() > 0.07 and area.max() <= 1.0
  assert 0 < area.mean() - their_area.mean() < 0.08
  for q in (0.25, 0.5, 0.75):
    assert 0 < np.quantile(area, q) - np.quantile(their_area, q) < 0.12, q
  assert 0.7 < aspect.min() and aspect.max() < 1.4
  assert 0.7 < their_aspect.min() and their_aspect.max() < 1.4
  assert abs(aspect.mean() - their_aspect.mean()) < 0.06
  assert abs(np.mean(aspect > 1) - np.mean(their_aspect > 1)) < 0.1


@needs_dali
def test_dalis_evaluation_images_equal_tf_datas_within_rounding(tmp_path):
  images = _digits(16)  # 20 x 24 noise: the hardest case for resizing.
  path = _write(tmp_path / 'eval-0', images, range(16))
  source = _input([path], False, 16, 32, 16)
  ours, labels = _run(source.pipeline(0, 1, None), 1)
  theirs = np.stack([decode.eval_image(tf.constant(_png(image)), 32,
                                       1.0).numpy() for image in images])
  np.testing.assert_array_equal(labels, np.arange(16))
  difference = np.abs(ours.astype(int) - theirs.astype(int))
  assert difference.max() <= 1, np.histogram(difference, bins=[0, 1, 2, 5,
                                                                 256])


@needs_dali
def test_two_hosts_read_disjoint_shards_and_each_epoch_in_another_order(
    tmp_path):
  path = _write(tmp_path / 'train-0', _digits(80), range(80))
  source = _input([path], True, 40, 16, 80)
  source = source.__class__(**dict(source.__dict__, shuffle_buffer=8))
  for shard, expected in ((0, set(range(40))), (1, set(range(40, 80)))):
    _, labels = _run(source.pipeline(shard, 2, None), 4)  # Two epochs.
    assert set(labels) == expected
    assert list(labels[:20]) != list(labels[40:60])


# --- whole runs, through both backends' DALI plugins ---------------------------


@pytest.fixture(scope='module')
def digits_dir(tmp_path_factory, tfds_dir):
  root = tmp_path_factory.mktemp('digits')
  result = run_module('launch.make_tfrecords', f'--output_dir={root}',
                      f'--data_dir={tfds_dir}', '--num_files=2')
  assert result.returncode == 0, result.stderr[-2000:]
  return root


def _flags(root, workdir, *extra):
  # The files hold digits: shifts, not the mirrored crops TFRecord files
  # of photographs take when augment is left open.
  return ('--backend=tensorflow', f'--workdir={workdir}',
          '--config.dataset=tfrecord', f'--config.train_files={root}/train-*',
          f'--config.eval_files={root}/eval-*', '--config.num_classes=10',
          '--config.augment=translate', *extra)


_TENSORFLOW = {'KERAS_BACKEND': 'tensorflow'}


def _one_error_line(result):
  assert result.returncode == 1 and 'Traceback' not in result.stderr, (
      result.stderr[-3000:])
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr[-3000:]
  return errors[0]


@needs_dali
def test_a_record_dali_cannot_decode_stops_the_run_naming_it(digits_dir,
                                                             tmp_path):
  good = list(tf.data.TFRecordDataset(str(digits_dir / 'train-00000-of-00002'))
              .take(3).as_numpy_iterator())
  damaged = tmp_path / 'data'
  damaged.mkdir()
  tfrecords.write(str(damaged / 'train-0'), good[:2] + [
      tfrecords.serialize(b'\xff\xd8 truncated jpeg', 3)] + good[2:] * 40)
  result = run_train(
      '--backend=tensorflow', f'--workdir={tmp_path / "run"}',
      '--config.dataset=tfrecord', f'--config.train_files={damaged}/train-*',
      f'--config.eval_files={digits_dir}/eval-*', '--config.num_classes=10',
      '--config.input_pipeline=dali', '--config.epochs=1',
      # Read in order: the damaged record is in the first batch (shuffled,
      # it could wait in the buffer past the run's last step).
      '--config.shuffle_buffer=1', '--config.global_batch_size=16',
      '--config.model=efficientnet_tiny', env=_TENSORFLOW)
  error = _one_error_line(result)
  assert error.startswith(
      f'error: DALI cannot decode record 2 of {damaged}/train-0 (')
  assert '--config.input_pipeline=tf.data, which skips' in error


@needs_dali
def test_a_label_out_of_range_stops_a_dali_run_in_one_line(digits_dir,
                                                           tmp_path):
  # The step checks the labels: DALI's dataset ends its chain.
  result = run_train(*_flags(digits_dir, tmp_path / 'run',
                             '--config.input_pipeline=dali',
                             '--config.num_classes=5', '--config.epochs=1',
                             '--config.model=efficientnet_tiny'),
                     env=_TENSORFLOW)
  assert re.match(r'error: label [5-9] \(after label_offset=0\) in a record '
                  rf'of {digits_dir}/train-00000-of-00002 \(or 1 other '
                  r'file\(s\)\) is outside \[0, 5\)', _one_error_line(result))


@needs_dali
@pytest.mark.slow
def test_dali_trains_to_tf_datas_accuracy_on_tensorflow(digits_dir, tmp_path):
  accuracy = {}
  for pipeline in ('tf.data', 'dali'):
    workdir = tmp_path / pipeline
    # Two replicas, one DALI pipeline each: evaluation's weights count
    # every example of both shards once (359, none of DALI's padding).
    result = run_train(*_flags(digits_dir, workdir,
                               f'--config.input_pipeline={pipeline}',
                               '--config.model=efficientnet_tiny',
                               '--config.epochs=6', '--num_cpu_devices=2'),
                       env=_TENSORFLOW)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f'Input: {pipeline} (as configured' in result.stderr
    metrics = json.loads((workdir / 'metrics.json').read_text())
    assert metrics['input_pipeline'] == pipeline
    assert metrics['num_replicas'] == 2 and metrics['eval_examples'] == 359
    accuracy[pipeline] = metrics['eval_accuracy']
  print(f'eval accuracy: {accuracy}')
  # The tiny network on digits reaches about 0.7 in 6 epochs; the two inputs
  # differ in order and crops only.
  assert accuracy['tf.data'] > 0.5 and accuracy['dali'] > 0.5, accuracy
  assert abs(accuracy['dali'] - accuracy['tf.data']) < 0.15, accuracy


@needs_dali
def test_benchmark_runs_both_pipelines_on_the_same_files(digits_dir,
                                                         tmp_path):
  result = run_module('launch.benchmark', *_flags(digits_dir, tmp_path / 'b'),
                      '--input_only', '--num_executions=2',
                      f'--output={tmp_path / "bench.json"}', env=_TENSORFLOW)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads((tmp_path / 'bench.json').read_text())
  for name in ('tf.data', 'dali'):
    assert figures['pipelines_images_per_sec'][name] > 0
  assert re.search(r'DALI \(CPU\), same files +[\d.]+ ', result.stdout)


# --- the JAX backend's plugin, over two CPU devices (the JAX environment) -----


@needs_dali
def test_jax_takes_dali_batches_of_a_pipeline_per_device_and_pads_evaluation(
    tmp_path, monkeypatch):
  """Two devices, two pipelines under one DALI iterator (DALI refuses an
  iterator over several pipelines that does not know their size)."""
  if jax is None:
    pytest.skip('runs in the JAX environment')
  from pipeline.backends.jax import dali_input  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import mesh  # pylint: disable=g-import-not-at-top
  strategy = mesh.DataParallel(jax.devices())
  assert strategy.num_replicas_in_sync == 2
  built = []
  build = dali.Input.pipeline
  monkeypatch.setattr(dali.Input, 'pipeline', lambda self, *args, **kw: (
      built.append(args[:2]), build(self, *args, **kw))[1])
  path = _write(tmp_path / 'eval-0', _digits(19), range(19))
  batches = dali_input.DaliBatches(strategy, _input([path], False, 8, 16, 19))
  for _ in range(2):  # Each pass starts again at the first record.
    labels, weights = [], []
    iterator = iter(batches)
    for _ in range(3):  # eval_steps: 19 examples in batches of 8.
      images, label, weight = strategy.to_devices(next(iterator))
      assert images.shape == (8, 16, 16, 3) and images.dtype == np.uint8
      assert len(images.sharding.device_set) == 2
      labels.append(np.asarray(label))
      weights.append(np.asarray(weight))
    labels, weights = np.concatenate(labels), np.concatenate(weights)
    np.testing.assert_array_equal(np.sort(labels[weights == 1]),
                                  np.arange(19))
    assert weights.sum() == 19
  assert built == [(0, 2), (1, 2)] * 2  # (shard, shards), a pass each.
  # Training: a stream without end, past the 19 records' epoch.
  train = dali_input.DaliBatches(strategy, _input([path], True, 8, 16, 19))
  iterator = iter(train)
  for _ in range(6):
    images, labels = strategy.to_devices(next(iterator))
    assert images.shape == (8, 16, 16, 3) and labels.shape == (8,)
  # Batches already on the devices (DALI's on GPUs) stay where they are.
  on_devices = strategy.to_devices([np.ones((8, 2), np.float32)])
  assert strategy.to_devices(on_devices)[0] is on_devices[0]


@needs_dali
def test_a_label_out_of_range_stops_jaxs_dali_batches_in_one_line(tmp_path):
  if jax is None:
    pytest.skip('runs in the JAX environment')
  from pipeline.backends.jax import dali_input  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import mesh  # pylint: disable=g-import-not-at-top
  path = _write(tmp_path / 'train-0', _digits(8), [0, 1, 2, 7, 0, 1, 2, 3])
  batches = dali_input.DaliBatches(mesh.DataParallel(jax.devices()),
                                   _input([path], False, 8, 16, 4))
  with pytest.raises(UserError, match=re.escape(
      f'label 7 (after label_offset=0) in a record of {path} is outside '
      '[0, 4)')):
    next(iter(batches))


@needs_dali
@pytest.mark.parametrize('augment', ['translate_flip', 'inception_randaugment'])
def test_every_augmentation_runs_on_dali(augment, tmp_path):
  path = _write(tmp_path / 'train-0', _digits(8), range(8))
  images, labels = _run(_input([path], True, 8, 32, 8,
                               augment=augment).pipeline(0, 1, None), 2)
  assert images.shape == (16, 32, 32, 3) and images.dtype == np.uint8
  assert set(labels) <= set(range(8))


@needs_dali
def test_label_offset_is_taken_off_as_tf_data_does(tmp_path):
  path = _write(tmp_path / 'eval-0', _digits(6), range(1, 7))  # ImageNet's.
  source = _input([path], False, 6, 16, 6)
  source = source.__class__(**dict(source.__dict__, label_offset=1))
  _, labels = _run(source.pipeline(0, 1, None), 1)
  np.testing.assert_array_equal(labels, np.arange(6))


@needs_dali
def test_a_hosts_pipelines_share_its_cores_and_decode_an_execution_ahead(
    tmp_path):
  path = _write(tmp_path / 'train-0', _digits(16), range(16))
  source = _input([path], True, 8, 16, 16)
  # Eight GPUs' pipelines on a 2-core host: one thread each, never 8 x 2.
  assert [source.threads(n) for n in (1, 2, 8)] == [2, 1, 1]
  pipeline = source.pipeline(0, 2, None, local_pipelines=2)
  assert pipeline.num_threads == 1
  config = _config(train_files=str(path), augment='none', shuffle_buffer=64,
                   seed=0, cache='')
  digits = types.SimpleNamespace(num_train_examples=16, num_classes=16,
                                 record_files={'train': (str(path),)},
                                 label_offset=0)
  depth = lambda batch, steps, shards=1: dali.train_input(
      InputSpec.of(config), digits, batch, str(tmp_path), steps,
      shards).prefetch_depth
  assert depth(256, 8, 8) == 8  # A GPU's share: an execution ahead.
  assert depth(256, 1) == 2  # Never less than DALI's default.
  # A TPU host's whole batch at 100 steps: what 2 GiB holds of them.
  assert depth(2048, 100) == (2 << 30) // (2048 * 224 * 224 * 3) == 6
