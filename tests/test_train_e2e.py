"""End-to-end runs of `python -m launch.train` in fresh processes.

Each run is the real pipeline: EfficientNet-B0 at 32 px on a slice of the
bundled digits, through tfds, the strategy, checkpoints and export.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from pipeline.errors import UserError
from pipeline.rules.config import request as request_lib

from conftest import REPO, check_exports_agree, check_keras_file_trains
from conftest import check_progress_lines
from conftest import run_module, run_train
from conftest import tensorflow_files, tiny_args, tree_digest
from test_console import ABSL_INFO, NOISE


def _metrics(workdir):
  with open(os.path.join(workdir, 'metrics.json')) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def mirrored_run(tmp_path_factory, tfds_dir):
  """The issue's acceptance command, shrunk: 2 replicas, bfloat16, 4 steps/call."""
  workdir = str(tmp_path_factory.mktemp('mirrored'))
  result = run_train(*tiny_args(workdir, tfds_dir, '--num_cpu_devices=2',
                                '--policy=mixed_bfloat16',
                                '--config.export=true'),
                     env={'TF_CPP_MIN_LOG_LEVEL': '1'})  # A user's level.
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir, result


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_mirrored_bfloat16_run_reports_two_replicas(mirrored_run):
  workdir, result = mirrored_run
  metrics = _metrics(workdir)
  assert metrics['strategy'] == 'MirroredStrategy'
  assert metrics['num_replicas'] == 2
  assert metrics['policy'] == 'mixed_bfloat16'
  assert metrics['steps_per_execution'] == 4
  assert metrics['initial_step'] == 0
  assert metrics['train_steps'] == metrics['total_steps'] == 16  # 2 x 256 // 32
  assert metrics['train_images_per_sec'] > 0
  # The final evaluation's printed line is what metrics.json keeps.
  final = re.search(r'Eval at step 16: accuracy (\d\.\d{4})', result.stderr)
  assert final, result.stderr[-2000:]
  assert metrics['eval_accuracy'] == pytest.approx(float(final.group(1)),
                                                   abs=5e-5)
  assert metrics['eval_examples'] == 359
  assert metrics['skipped_steps'] == 0 and metrics['final_loss_scale'] is None
  for line in ('MirroredStrategy, 2 replica(s)', 'Precision: mixed_bfloat16',
               'XLA: off', 'Batch: 32 global, 16 per replica'):
    assert line in result.stderr
  run = json.load(open(os.path.join(workdir, 'run.json')))
  assert run['config']['global_batch_size'] == 32
  assert run['resolved']['per_replica_batch_size'] == 16


def test_progress_says_the_gradient_norm_and_when_the_run_ends(mirrored_run):
  _, result = mirrored_run
  check_progress_lines(result.stderr, 16)


def test_a_pipe_gets_plain_lines_without_the_noise(mirrored_run):
  """Output into a pipe (a file, CI, a cloud job's log): no progress bar, no
  control character, none of the start-up and library noise; the run's
  own lines are short, and run.log has the full log."""
  workdir, result = mirrored_run
  text = result.stdout + result.stderr
  assert not re.search(r'[\x00-\x08\x0b-\x1f\x7f]', text)
  assert not NOISE.search(text), NOISE.search(text).group(0)
  assert not ABSL_INFO.search(text), ABSL_INFO.search(text).group(0)
  assert re.search(r'^\d\d:\d\d:\d\d step 16/16 \(epoch 2\.0\)',
                   result.stderr, re.M)
  with open(os.path.join(workdir, 'run.log')) as f:
    log = f.read()
  assert re.search(r'^I\d{4} [\d:.]+ +\d+ plan\.py:\d+\] Run: CPU', log,
                   re.M)
  # A library's INFO lines (tfds reading its files) are kept there.
  assert re.search(r'^I\d{4} .* (reader|dataset_builder)\.py:\d+\] ', log,
                   re.M)


def test_export_loads_in_fresh_process(mirrored_run):
  workdir, _ = mirrored_run
  script = (
      'import sys, numpy as np, tensorflow as tf\n'
      'model = tf.saved_model.load(sys.argv[1])\n'
      'x = np.random.randint(0, 256, (3, 32, 32, 3), dtype=np.uint8)\n'
      'p = model.serve(x).numpy()\n'
      'assert p.dtype == np.float32 and p.shape == (3, 10), (p.dtype, p.shape)\n'
      'assert np.allclose(p.sum(-1), 1, atol=1e-4), p.sum(-1)\n'
      'print("ok")\n')
  result = subprocess.run(
      [sys.executable, '-c', script, os.path.join(workdir, 'export')],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0 and 'ok' in result.stdout, result.stderr[-2000:]
  # The network in Keras' own format, for a Keras user to train on.
  check_keras_file_trains(os.path.join(workdir, 'export'))


def test_evaluate_reports_the_runs_accuracy(mirrored_run):
  """launch.evaluate on the finished run: its newest committed checkpoint,
  its config (run.json), the same 2 replicas: the accuracy it reported."""
  workdir, _ = mirrored_run
  metrics = _metrics(workdir)
  result = run_module('launch.evaluate', f'--workdir={workdir}',
                      '--num_cpu_devices=2', '--export=export-again',
                      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f'Evaluated step 16 on sklearn_digits held-out (359 examples): '
          f'accuracy {metrics["eval_accuracy"]:.4f}') in result.stdout
  # The checkpoint it evaluated, exported again: the run's own export.
  assert f'Exported step 16 to {workdir}/export-again' in result.stdout
  check_exports_agree(os.path.join(workdir, 'export'),
                      os.path.join(workdir, 'export-again'), atol=1e-6)
  assert ("confusion matrix (rows: true, columns: predicted, by the rows' "
          'numbers):') in result.stdout
  # The run's policy, and where it came from.
  assert ("Precision: mixed_bfloat16 (the run's, from its run.json); loss "
          'scaling off') in result.stderr
  assert not ABSL_INFO.search(result.stderr), result.stderr[-3000:]
  report = json.load(open(os.path.join(workdir, 'evaluation',
                                       'held-out-step16.json')))
  assert report['accuracy'] == pytest.approx(metrics['eval_accuracy'],
                                             abs=1e-6)
  assert sum(map(sum, report['confusion_matrix'])) == 359
  assert report['top5_accuracy'] == pytest.approx(
      metrics['eval_top5_accuracy'], abs=1e-6)
  assert os.path.getsize(os.path.join(workdir, 'evaluation',
                                      'held-out-step16.png')) > 1000
  # --checkpoint=5, which is not there: one line listing the committed ones.
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  from pipeline.storage.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  reader = Checkpointer(workdirs.Workdir(workdir, workdir), 3, False,
                        tensorflow_files(value=tf.Variable(0.0)))
  with pytest.raises(UserError, match=r'has no committed checkpoint of step 5'
                     r'; committed: 16$'):
    reader.restore_step(5)


def test_follow_evaluates_committed_checkpoints_once(mirrored_run, tmp_path,
                                                    tfds_dir):
  """In-process, on a copy of the finished run with a hand-made half-written
  checkpoint (files of step 20, not in the state file): only the committed
  final checkpoint is evaluated, once, and following stops there."""
  import shutil  # pylint: disable=g-import-not-at-top
  from pipeline.rules.machine import hardware as devices  # pylint: disable=g-import-not-at-top
  from pipeline.reports import evaluation  # pylint: disable=g-import-not-at-top
  from pipeline.run import plan as plan_lib  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  shutil.copytree(mirrored_run[0], workdir)
  folder = os.path.join(workdir, 'checkpoints')
  for name in os.listdir(folder):
    if name.startswith('ckpt-16.'):
      shutil.copy(os.path.join(folder, name),
                  os.path.join(folder, name.replace('ckpt-16', 'ckpt-20')))
  config, policy, _ = evaluation.run_config(workdir, str(tmp_path), {})
  assert policy == 'mixed_bfloat16'
  config.data_dir = tfds_dir
  # As launch.evaluate asks: the run's policy, a workdir it reads.
  plan = plan_lib.resolve(config, request_lib.Request(
      workdir=workdir, policy=policy, trains=False),
                          devices.Hardware(tf.distribute.get_strategy(),
                                           'CPU', detail='host CPU'))
  try:
    evaluator = evaluation.Evaluator(plan)  # Sets the run's policy.
    reports = evaluator.follow(poll_s=0.1, timeout_s=5)
  finally:  # Other modules of this process build under float32.
    import keras  # pylint: disable=g-import-not-at-top
    keras.mixed_precision.set_global_policy('float32')
  assert [r['step'] for r in reports] == [16]
  assert os.path.exists(os.path.join(workdir, 'evaluation',
                                     'held-out-step16.json'))
  tags = {v.tag for path in tf.io.gfile.glob(os.path.join(
      workdir, 'tensorboard', 'evaluator', 'events.*'))
          for event in tf.compat.v1.train.summary_iterator(path)
          for v in event.summary.value}
  assert {'accuracy', 'loss'} <= tags


@pytest.mark.slow
def test_follow_a_live_training_run(tmp_path, tfds_dir):
  """launch.evaluate --follow beside a training process: each checkpoint
  (every 4 steps, 16 in all) evaluated exactly once, then it stops."""
  workdir = str(tmp_path / 'run')
  trainer = subprocess.Popen(
      [sys.executable, '-m', 'launch.train',
       *tiny_args(workdir, tfds_dir, '--config.checkpoint_every_steps=4')],
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    _wait_for_checkpoint(trainer, workdir)
    result = run_module('launch.evaluate', f'--workdir={workdir}',
                        '--follow', '--poll_s=1', '--follow_timeout_s=300',
                        timeout=600)
  finally:
    trainer.communicate(timeout=600)
  assert trainer.returncode == 0
  assert result.returncode == 0, result.stderr[-3000:]
  steps = [int(line.split('Evaluated step ')[1].split()[0])
           for line in result.stderr.splitlines() if 'Evaluated step ' in line]
  assert steps == sorted(set(steps)) and steps[-1] == 16, steps
  assert 'Evaluated the final step 16; stopping' in result.stderr


def test_predict_from_image_files(mirrored_run, tmp_path):
  """The export and its metadata alone: JPEG, PNG and grayscale files of
  any size; a corrupt one is skipped with its reason."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from pipeline.data import decode  # pylint: disable=g-import-not-at-top
  from pipeline.reports import predict  # pylint: disable=g-import-not-at-top
  workdir, _ = mirrored_run
  pixels = (np.random.RandomState(0).rand(50, 70, 3) * 255).astype(np.uint8)
  Image.fromarray(pixels).save(tmp_path / 'a.jpg')
  Image.fromarray(pixels).save(tmp_path / 'b.png')
  Image.fromarray(pixels[..., 0]).save(tmp_path / 'gray.jpg')
  (tmp_path / 'broken.jpg').write_bytes(b'not an image')
  model, metadata = predict.load(os.path.join(workdir, 'export'))
  assert metadata['class_names'] == [str(i) for i in range(10)]
  assert metadata['preprocessing']['image_size'] == 32
  assert metadata['preprocessing']['central_fraction'] == 1.0
  images, paths, skipped = predict.read_images(
      predict.expand([str(tmp_path / '*')]), metadata['preprocessing'])
  assert [os.path.basename(p) for p in paths] == ['a.jpg', 'b.png',
                                                  'gray.jpg']
  # TensorFlow's own reason; 2.21 (not the TPU build's 2.20) reads JPEG XL.
  formats = ('JPEG, JPEG XL, PNG' if tf.__version__.startswith('2.21') else
             'JPEG, PNG')
  assert [(os.path.basename(p), r) for p, r in skipped] == [
      ('broken.jpg', f'Unknown image file format. One of {formats}, GIF, BMP, '
       'WebP required.')]
  probs = predict.probabilities(model, images, batch_size=2)
  assert probs.shape == (3, 10)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  # Exactly evaluation's preprocessing, pixel for pixel...
  with open(tmp_path / 'b.png', 'rb') as f:
    np.testing.assert_array_equal(images[1],
                                  decode.eval_image(f.read(), 32, 1.0).numpy())
  # ...through the export's signature, batch by batch (a batch of another
  # size may round differently on a CPU: 1e-3 apart under bfloat16).
  np.testing.assert_allclose(probs[:2], model.serve(images[:2]).numpy(),
                             rtol=1e-6)
  top = predict.top_k(probs, metadata['class_names'], 3)
  assert [len(row) for row in top] == [3, 3, 3]
  assert all(row[0][1] >= row[1][1] >= row[2][1] for row in top)
  with pytest.raises(UserError, match='is not an export of launch.train'):
    predict.load(str(tmp_path))


def test_tensorboard_scalars_written(mirrored_run):
  """Every scalar, to the last step: the process ends without Python's
  teardown, so the run flushed its writers itself."""
  workdir, _ = mirrored_run
  last_step = {}
  for split in ('train', 'eval'):
    for path in tf.io.gfile.glob(os.path.join(workdir, 'tensorboard', split,
                                              'events.*')):
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          tag = f'{split}/{value.tag}'
          last_step[tag] = max(last_step.get(tag, 0), event.step)
  total_steps = _metrics(workdir)['total_steps']
  for tag in ('train/loss', 'train/learning_rate', 'train/images_per_sec',
              'train/grad_norm', 'eval/accuracy', 'eval/loss'):
    assert last_step.get(tag) == total_steps, (tag, last_step)


def _wait_for_checkpoint(process, workdir, timeout_s=400):
  state = os.path.join(workdir, 'checkpoints', 'checkpoint')
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    if os.path.exists(state):
      return
    if process.poll() is not None:
      raise AssertionError('run ended before its first checkpoint: ' +
                           process.stderr.read()[-3000:])
    time.sleep(0.2)
  raise AssertionError('no checkpoint within the timeout')


@pytest.mark.slow
def test_killed_run_resumes_its_step_count(tmp_path, tfds_dir):
  """SIGKILL after the first checkpoint, rerun: the step count continues.

  mixed_float16 puts the loss scale in the checkpoint too. Slow tier (2.5
  minutes: float16 runs emulated on a CPU); the fast tier kills and resumes
  a run through GCS (test_gcs_run.py) and resumes in-process.
  """
  workdir = str(tmp_path / 'run')
  args = tiny_args(workdir, tfds_dir, '--policy=mixed_float16',
                   '--config.epochs=4', '--config.checkpoint_every_steps=8')
  process = subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                             cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  try:
    _wait_for_checkpoint(process, workdir)
  finally:
    process.kill()
    process.wait()
  committed = tf.train.latest_checkpoint(os.path.join(workdir, 'checkpoints'))
  committed_step = int(committed.rsplit('-', 1)[1])
  assert committed_step >= 8
  assert not os.path.exists(os.path.join(workdir, 'metrics.json'))

  result = run_train(*args)
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(workdir)
  assert metrics['initial_step'] >= committed_step
  assert metrics['initial_step'] % 8 == 0  # A committed checkpoint, no other.
  assert metrics['train_steps'] == 32 - metrics['initial_step']
  assert f'Resuming at step {metrics["initial_step"]} of 32' in result.stderr
  assert metrics['final_loss_scale'] > 0
  assert 'loss scale' in result.stderr

  # A third run finds the work done: nothing trains, the step stays put.
  again = run_train(*args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert _metrics(workdir)['initial_step'] == 32
  assert _metrics(workdir)['train_steps'] == 0


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_bad_input_fails_in_one_line_and_keeps_the_workdir(mirrored_run,
                                                           tfds_dir):
  """Mistakes the launcher meets before anything is built, each a real
  process on the finished run's workdir, two at a time: one line, a
  non-zero exit, the workdir untouched. Bad config values are
  tests/test_validation.py's table (the same UserError path)."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  workdir, _ = mirrored_run
  before = tree_digest(workdir)
  train, evaluate = 'launch.train', 'launch.evaluate'
  cases = [
      (train, ['--policy=fp8'], '--policy=fp8'),
      (train, ['--num_cpu_devices=2', '--config.global_batch_size=33'],
       'global_batch_size=33'),
      (train, ['--config.dataset=no_such_set'], "'no_such_set'"),
      (train, ['--config.no_such_key=1'], "'no_such_key'"),
      # --config=FILE must come before its --config.KEY overrides.
      (train, ['--config=configs/no_such_config.py'],
       'configs/no_such_config.py'),
      (train, ['--config.model=efficientnet_b1'], 'efficientnet_b1'),
      # The run's own export is not evaluate's to overwrite.
      (evaluate, ['--export=export'], '--export=export: give a folder name '
       'that starts with "export-"'),
  ]
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda case: run_module(
        case[0], *case[1], f'--workdir={workdir}',
        f'--config.data_dir={tfds_dir}', timeout=300), cases))
  for (_, flags, named), result in zip(cases, results):
    errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
    assert result.returncode != 0 and 'Traceback' not in result.stderr, flags
    assert len(errors) == 1 and named in errors[0], result.stderr[-2000:]
  assert tree_digest(workdir) == before


def test_unwritable_workdir_fails_in_one_line(tmp_path, tfds_dir):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  workdir = str(blocker / 'run')
  result = run_train(f'--workdir={workdir}', f'--config.data_dir={tfds_dir}',
                     timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert f"error: workdir '{workdir}' cannot be written" in result.stderr
  assert blocker.read_text() == 'not a directory'
