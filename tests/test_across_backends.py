"""Runs that cross the backends, in the JAX environment: a JAX run's
checkpoint read, evaluated, exported and fine-tuned from on TensorFlow, a
TensorFlow run's on JAX, and both backends benchmarked side by side.

Runs where requirements-jax-test.txt is installed (CI's third environment,
which has TensorFlow's CPU build too); skipped without JAX. Each run is a
real `python -m launch.train` over two CPU devices, ten steps of the tiny
network (conftest.jax_args). PIPELINE_TF_PYTHON names a TensorFlow
environment's interpreter (CI sets it to .venv/bin/python): a JAX run's
checkpoint is then evaluated there too. tests/test_jax_backend.py has the
JAX backend's own runs.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO
from conftest import check_exports_agree
from conftest import check_keras_file_trains
from conftest import check_onnx_agrees_with_the_saved_model
from conftest import check_tflite_agrees_with_the_saved_model
from conftest import jax_args
from conftest import network_arithmetic
from conftest import run_module
from conftest import run_train

jax = pytest.importorskip('jax', reason='the JAX suite runs in the JAX '
                          'environment (requirements-jax-test.txt)')

TF_PYTHON = os.environ.get('PIPELINE_TF_PYTHON')


def _env(emulator):
  return {'STORAGE_EMULATOR_HOST': emulator.host,
          'GOOGLE_CLOUD_PROJECT': 'test'}


def _committed(emulator, prefix):
  return sorted(int(n.split('/ckpt-')[1].split('/')[0])
                for n in emulator.names('runs', f'{prefix}/checkpoints/')
                if n.endswith('/COMMITTED'))



def test_a_run_killed_on_one_machine_resumes_on_another_and_tensorflow_reads_it(
    emulator, tfds_dir, tmp_path):
  url = 'gs://runs/jax'
  env = dict(os.environ, **_env(emulator))
  first = subprocess.Popen(
      [sys.executable, '-m', 'launch.train',
       *jax_args(url, tfds_dir, f'--staging_dir={tmp_path / "machine-a"}',
              '--workdir_lease_s=8')],
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True)
  try:
    deadline = time.time() + 400
    while not _committed(emulator, 'jax'):
      assert first.poll() is None, first.stderr.read()[-3000:]
      assert time.time() < deadline, 'no committed checkpoint in time'
      time.sleep(0.5)
  finally:
    first.kill()  # kill -9: no chance to save or release anything.
    first.wait()
  committed = _committed(emulator, 'jax')[-1]

  result = run_train(*jax_args(url, tfds_dir,
                            f'--staging_dir={tmp_path / "machine-b"}',
                            '--workdir_lease_s=8', '--config.export=true',
                            '--config.export_onnx=true'),
                     env=_env(emulator))
  assert result.returncode == 0, result.stderr[-3000:]
  log = result.stderr
  assert 'Backend: jax (asked for with --backend=jax)' in log
  assert 'with DataParallel, 2 replica(s) over 1 worker(s)' in log
  assert f'Resuming at step {committed} of 10' in log
  assert 'Taking over the lapsed lease' in log
  bucket = emulator.client().bucket('runs')
  metrics = json.loads(bucket.blob('jax/metrics.json').download_as_bytes())
  assert metrics['backend'] == 'jax'
  assert metrics['num_replicas'] == 2 and metrics['strategy'] == 'DataParallel'
  assert metrics['initial_step'] == committed and metrics['total_steps'] == 10
  assert 'jax/checkpoints/ckpt-10/ckpt-10.weights.h5' in emulator.names(
      'runs', 'jax/checkpoints/')
  # The moving average was evaluated, not the raw weights again.
  assert metrics['eval_loss'] != metrics['eval_loss_raw']
  # ONNX from a JAX run: what its SavedModel computes.
  check_onnx_agrees_with_the_saved_model(
      tmp_path / 'machine-b' / 'runs' / 'jax' / 'export')
  assert 'Exported model.onnx: its probabilities within' in log

  if not TF_PYTHON:
    return  # The TensorFlow side below needs a TensorFlow environment.
  evaluated = subprocess.run(
      [TF_PYTHON, '-m', 'launch.evaluate', f'--workdir={url}',
       f'--staging_dir={tmp_path / "tf-machine"}', '--export=export-tf'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  accuracy = float(re.search(r'accuracy (\d\.\d+)', evaluated.stdout).group(1))
  assert abs(accuracy - metrics['eval_accuracy']) <= 0.005, evaluated.stdout
  assert 'Backend: tensorflow' in evaluated.stderr
  # Exported on TensorFlow from the JAX run's checkpoint: the JAX export.
  assert f'Exported step 10 to {url}/export-tf' in evaluated.stdout
  assert 'jax/export-tf/saved_model.pb' in emulator.names('runs', 'jax/')
  check_exports_agree(tmp_path / 'machine-b' / 'runs' / 'jax' / 'export',
                      tmp_path / 'tf-machine' / 'runs' / 'jax' / 'export-tf',
                      atol=1e-4)


def test_a_bfloat16_jax_run_profiles_exports_predicts_and_tensorflow_tunes_it(
    tfds_dir, tmp_path):
  workdir = tmp_path / 'run'
  result = run_train(*jax_args(workdir, tfds_dir, '--config.ema_decay=0',
                            '--policy=mixed_bfloat16',
                            '--config.profile_steps=4,8',
                            '--config.export_tflite=float16',
                            '--config.export=true'))
  assert result.returncode == 0, result.stderr[-3000:]
  # JAX's profiler traced steps 4 to 8 into TensorBoard's Profile tab.
  assert 'Profiled steps 4 to 8' in result.stderr
  assert list((workdir / 'tensorboard' / 'plugins' / 'profile').glob(
      '*/*.xplane.pb'))
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert (metrics['policy'], metrics['backend']) == ('mixed_bfloat16', 'jax')
  assert 0 < metrics['eval_loss'] < 10  # bfloat16 did not overflow.
  metadata = json.loads((workdir / 'export' / 'metadata.json').read_text())
  assert metadata['class_names'][:2] == ['0', '1']
  # The LiteRT model, converted on TensorFlow from the same weights, agrees
  # with the bfloat16 SavedModel to bfloat16's precision.
  check_tflite_agrees_with_the_saved_model(str(workdir / 'export'),
                                           atol=2e-2)
  # model.keras, written on JAX: read and trained on JAX and TensorFlow.
  check_keras_file_trains(str(workdir / 'export'))
  if TF_PYTHON:
    check_keras_file_trains(str(workdir / 'export'), TF_PYTHON, 'tensorflow')
  images = tmp_path / 'digits'
  images.mkdir()
  from PIL import Image  # pylint: disable=g-import-not-at-top
  for i in range(3):
    Image.new('RGB', (32, 32), (i * 80, 0, 0)).save(images / f'{i}.png')
  for python in [sys.executable] + ([TF_PYTHON] if TF_PYTHON else []):
    predicted = subprocess.run(
        [python, "-m", "launch.predict", f"--model={workdir / 'export'}",
         str(images / '*.png')], cwd=REPO, capture_output=True, text=True,
        timeout=300, check=False)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert predicted.stdout.count('.png') == 3, predicted.stdout
  # A TensorFlow run fine-tunes from it (its Keras files read by TF), head
  # and all: the same classes.
  tuned = run_train(*jax_args(tmp_path / 'tuned', tfds_dir, devices=1)[1:],
                    '--backend=tensorflow', f'--config.init_from={workdir}',
                    '--config.examples_per_epoch=64')
  assert tuned.returncode == 0, tuned.stderr[-3000:]
  assert (f'head (the same 10 classes) and backbone from step 10 of the run '
          f'in {workdir}') in tuned.stderr


def test_a_tensorflow_run_is_evaluated_and_tuned_on_jax_and_resumes_on_tensorflow_only(
    tfds_dir, tmp_path):
  """The reverse of the first test: a TensorFlow run (this environment has
  TensorFlow's CPU build) read by launch.evaluate on JAX, its figures within
  0.005, and exported there as its own export; a JAX run fine-tunes from
  it; `--backend=jax` does not train on in its workdir."""
  workdir = tmp_path / 'run'
  trained = run_train(*jax_args(workdir, tfds_dir, devices=1)[1:],
                      '--backend=tensorflow', '--config.export=true')
  assert trained.returncode == 0, trained.stderr[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['backend'] == 'tensorflow'
  evaluated = run_module('launch.evaluate', f'--workdir={workdir}',
                         '--backend=jax', '--num_cpu_devices=2',
                         '--export=export-jax')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert 'Backend: jax' in evaluated.stderr
  accuracy = float(re.search(r'accuracy (\d\.\d+)', evaluated.stdout)[1])
  assert abs(accuracy - metrics['eval_accuracy']) <= 0.005, (
      accuracy, metrics['eval_accuracy'], evaluated.stdout)
  # Exported on JAX from the TensorFlow run's checkpoint: its own export.
  check_exports_agree(workdir / 'export', workdir / 'export-jax', atol=1e-4)
  resumed = run_train(*jax_args(workdir, tfds_dir), '--dry_run')
  assert resumed.returncode == 1
  assert resumed.stderr.strip().splitlines()[-1] == (
      f"error: workdir '{workdir}' holds a run trained on tensorflow, which "
      'resumes there only: --backend=tensorflow, or another --workdir')
  # A JAX run fine-tunes from it (its moving average, read through the
  # checkpoint's object graph), the backbone frozen for its first step (the
  # frozen program's arithmetic: test_trainer_jax.py).
  tuned = run_train(*jax_args(tmp_path / 'tuned', tfds_dir),
                    f'--config.init_from={workdir}',
                    '--config.examples_per_epoch=64',
                    '--config.freeze_backbone_epochs=0.5')
  assert tuned.returncode == 0, tuned.stderr[-3000:]
  assert (f'head (the same 10 classes) and backbone from step 10 of the run '
          f'in {workdir} (its moving average)') in tuned.stderr
  assert 'backbone frozen for the first 1 steps' in tuned.stderr


# Two backends' compiles, one device each (a second would trace
# TensorFlow's step twice), of B0 itself: its convolutions are most of its
# arithmetic, so the two backends' counts agree closely (the tiny network
# spends a larger share in elementwise work, which they count apart). A
# batch of 8, one step an execution: B0's compiles are the test, and JAX's
# B0 runs about 25 images/s on this CPU.
@pytest.mark.slow
def test_benchmark_measures_both_backends_side_by_side(tfds_dir, tmp_path):
  output = tmp_path / 'backends.json'
  result = run_module(
      'launch.benchmark', '--backends=tensorflow,jax',
      f'--config.data_dir={tfds_dir}', '--config.global_batch_size=8',
      '--config.steps_per_execution=1', '--num_executions=2',
      f'--output={output}')
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(output.read_text())['backends']
  assert [name for name, _ in rows] == ['tensorflow', 'jax']
  assert [r['backend'] for _, r in rows] == ['tensorflow', 'jax']
  assert [r['strategy'] for _, r in rows] == ['DefaultStrategy',
                                              'DataParallel']
  for _, r in rows:
    assert r['train_synthetic_images_per_sec'] > 0
    assert r['train_real_images_per_sec'] > 0
  # One forward and backward pass per image, each backend's own program
  # counted before XLA optimises it: the same arithmetic, so the figures
  # agree, and each about 3 x 2 FLOPs a multiply-add of the network's
  # layers (the gradients of each layer's input and weights backward),
  # elementwise work adding under 30% more (B0 here: 1.04x).
  flops = [r['flops_per_image'] for _, r in rows]
  parameters, _, macs, activations = network_arithmetic(
      'efficientnet_b0', 32, num_classes=10)
  assert 6 * macs * 0.95 < flops[0] < 6 * macs * 1.3, (flops, macs)
  assert flops[1] == pytest.approx(flops[0], rel=0.05)
  for _, r in rows:
    # At least each layer's float32 input read and output written forward,
    # as many backward (the gradients of its output read, of its input
    # written), and the weights read and their gradients written once for
    # the 8 images of a step (B0 here: 13.6 MB; TensorFlow's program 93,
    # JAX's 74).
    assert r['bytes_per_image'] > 2 * 4 * (activations + parameters / 8), (
        r['bytes_per_image'], activations, parameters)
    assert r['achieved_flops_per_sec'] == pytest.approx(
        r['flops_per_image'] * r['train_synthetic_images_per_sec'])
    assert r['overlap_wall_vs_sum'] > 0
  for name in ('jax', 'tensorflow'):
    assert re.search(
        rf"^{name}: per image \(one micro-batch's forward "
        r'and backward pass, counted from the unoptimized program '
        r"\(XLA's CPU cost model; bytes before fusion\)\): [\d.]+ GFLOP",
        result.stdout, re.M), result.stdout
  assert 'of the peak: no figure for host CPU' in result.stdout
  assert re.search(r'^jax +DataParallel x1 +\d+\.\d', result.stdout, re.M)
  assert re.search(r'^tensorflow +DefaultStrategy x1 +\d+\.\d',
                   result.stdout, re.M)


_NO_COST_ANALYSIS = '''
"""Started before the benchmark (sitecustomize): XLA's cost analysis fails
on both backends, as on a PJRT plugin that has none."""
from jax._src import stages
from jax._src.lib import xla_client


def _unavailable(*args, **kwargs):
  raise NotImplementedError('no cost analysis on this plugin')


stages.Compiled.cost_analysis = _unavailable
xla_client._xla.hlo_module_cost_analysis = _unavailable
'''


@pytest.mark.slow  # two backends' compiles
def test_without_cost_analysis_the_benchmark_prints_every_other_figure(
    tfds_dir, tmp_path):
  """The CPU always has a cost analysis; a GPU's or TPU's plugin may not.
  Made unavailable here from outside the project (a sitecustomize), every
  other figure of both backends still stands, and each says why it has no
  FLOPs."""
  (tmp_path / 'site').mkdir()
  (tmp_path / 'site' / 'sitecustomize.py').write_text(_NO_COST_ANALYSIS)
  output = tmp_path / 'backends.json'
  result = run_module(
      'launch.benchmark', '--backends=tensorflow,jax',
      f'--config.data_dir={tfds_dir}', '--config.global_batch_size=8',
      '--config.model=efficientnet_tiny',
      '--config.steps_per_execution=1', '--num_executions=2',
      f'--output={output}', env={'PYTHONPATH': str(tmp_path / 'site')})
  assert result.returncode == 0, result.stderr[-3000:]
  rows = dict(json.loads(output.read_text())['backends'])
  for name in ('tensorflow', 'jax'):
    r = rows[name]
    assert r['train_synthetic_images_per_sec'] > 0
    assert r['train_real_images_per_sec'] > 0
    assert r['input_warm_images_per_sec'] > 0
    assert r['overlap_wall_vs_sum'] > 0
    assert 'flops_per_image' not in r and 'achieved_flops_per_sec' not in r
    assert 'no cost analysis on this plugin' in r['step_cost_reason']
    assert re.search(rf'^{name}: FLOPs per image: none \(.*no cost analysis '
                     'on this plugin', result.stdout, re.M)
    assert re.search(rf'^{name} +\w+ x1 +\d+\.\d', result.stdout, re.M)
