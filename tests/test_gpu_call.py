"""The prepared call for a lent GPU (launch.gpu_call) and what it leans on,
on this CPU where TensorFlow is absent, as on the lent machine: XLA's
autotune flags given to the pinned jaxlib, the probe's picks set before
XLA starts, the call at a tiny size to its last line, and its summary and
kernel classes read from what an H200 gave (tests/fixtures/h200/)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('jax', reason='needs JAX (the probe\'s environment)')

from conftest import REPO  # pylint: disable=g-import-not-at-top,wrong-import-position
from conftest import run_module  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import gpu_call  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import kernel_times  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import picks  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.rules.speed import autotune  # pylint: disable=g-import-not-at-top,wrong-import-position

FIXTURES = os.path.join(REPO, 'tests', 'fixtures', 'h200')


def _convolve_with(xla_flags):
  return subprocess.run(
      [sys.executable, '-c', gpu_call._TINY_CONVOLUTION],  # pylint: disable=protected-access
      capture_output=True, text=True, check=False, timeout=300,
      env=dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS='cpu'))


def test_each_autotune_flag_is_one_the_pinned_jaxlib_knows(tmp_path):
  """XLA aborts a process on a flag it does not know, whatever the device:
  every flag autotune.py gives XLA passes, in the process that compiles;
  a made-up one aborts the same way."""
  results = str(tmp_path / 'picks.textproto')
  flags = [f'{autotune.DUMP_FLAG}={results}',
           *autotune.flags(os.path.join(FIXTURES, 'autotune_dump.textproto'),
                           require_complete=True)]
  assert {flag.split('=')[0] for flag in flags} == set(autotune.FLAGS)
  done = _convolve_with(' '.join(flags))
  assert done.returncode == 0, done.stderr[-2000:]
  unknown = _convolve_with('--xla_gpu_load_autotune_results_form=x')
  assert unknown.returncode != 0
  assert 'xla_gpu_load_autotune_results_form' in unknown.stderr


def test_the_probe_sets_its_picks_before_xla_starts(tmp_path, monkeypatch):
  """Every probe process writes its picks; 'load' and 'require' add the
  saved ones for this card (require-complete too), 'fresh' does not;
  'require' with none saved is one line; without a GPU nothing loads."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  gpus = ['NVIDIA H200']
  environ = {}
  with pytest.raises(ValueError, match='no picks saved for NVIDIA H200'):
    picks.prepare_autotune(str(tmp_path / 'out'), 'require', environ, gpus)
  saved = autotune.save(os.path.join(FIXTURES, 'autotune_dump.textproto'),
                        'NVIDIA H200', picks.JaxBackend().software(),
                        'b0-224', {})
  assert saved
  loaded = picks.prepare_autotune(str(tmp_path / 'out'), 'require',
                                    environ, gpus)
  dump = f"{autotune.DUMP_FLAG}={tmp_path / 'out' / 'autotune.textproto'}"
  assert environ['XLA_FLAGS'] == ' '.join(
      [dump, *autotune.flags(loaded, require_complete=True)])
  fresh = {}
  assert picks.prepare_autotune(str(tmp_path / 'out'), 'fresh', fresh,
                                  gpus) is None
  assert fresh['XLA_FLAGS'] == dump
  assert picks.prepare_autotune(str(tmp_path / 'out'), 'require', {},
                                  []) is None


def test_the_fastest_process_near_the_median_keeps_its_picks():
  rows = [('a', {'images_per_sec': 8011.0}, 'A'),
          ('b', {'images_per_sec': 8808.0}, 'B'),
          ('c', {'images_per_sec': 8843.0}, 'C'),
          ('d', {'failed': 'exit 1'}, 'D')]
  # The median is 8808: 8843 is within 2% and the fastest; 8011 is a slow
  # draw, never kept.
  assert picks.fastest_near_median(rows) == ('c', 'C')
  assert picks.fastest_near_median(rows[:1] + rows[2:3]) is None
  assert picks.fastest_near_median(rows[3:]) is None


def test_the_calls_summary_of_what_an_h200_gave():
  """The first call on an H200 (the picks not yet saved, so its loading
  steps stopped in one line; its form steps' names since prefixed with
  `with_`): its figures as the summary reads them."""
  with open(os.path.join(FIXTURES, 'call_1.json'), encoding='utf-8') as f:
    steps = json.load(f)['steps']
  summary = gpu_call.summarize(steps)
  assert summary['of_A'] == {'keras': round(8843.6 / 8011.4, 4)}
  assert summary['same_algorithms_as_A'] == {'keras': False}
  assert summary['with_pallas_of_baseline'] == round(7006.1 / 8843.6, 4)
  assert 'host_fed_of_keras_fit' not in summary  # Keras' fit was skipped.
  assert steps['B']['failed'].endswith('save them first with '
                                       '--save_autotune')


def test_pallas_kernels_are_classed_by_their_names_inside_command_buffers():
  """On the H200 the Pallas kernels ran inside XLA's command buffers,
  named after their functions: each is its depthwise class."""
  for kernel, direction in (
      ('_depthwise_forward_kernel__3', 'forward'),
      ('_depthwise_data_gradient_kernel__8', 'data gradient'),
      ('_depthwise_filter_gradient_kernel__10', 'filter gradient')):
    assert kernel_times.class_of_event('command_buffer_1236', kernel, {},
                                       {}) == (
                                           f'depthwise convolution: '
                                           f'{direction}')
  assert kernel_times.class_of_event('command_buffer_1', 'loop_fusion_2', {},
                                     {}) is None


def test_the_prepared_call_runs_to_its_last_line_on_this_cpu(tmp_path):
  """Every step at a tiny size (the Pallas forms interpreted): each probe
  process ends with its figures, the summary is written, the last line
  says where. No GPU autotunes here, so no picks are saved: the loading
  steps load none, and say nothing is required of them."""
  out = tmp_path / 'call'
  result = run_module(
      'launch.gpu_call', f'--out={out}', '--budget_s=1500',
      '--image_size=32', '--batch_size=8', '--executions=1',
      '--steps_per_execution=1', '--num_classes=10',
      '--config.model=efficientnet_tiny',
      env={'KERAS_BACKEND': 'jax', 'XDG_CACHE_HOME': str(tmp_path / 'c')},
      timeout=1600)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert lines[-1] == f'gpu_call: done in {json.load(open(out / "call.json"))["elapsed_s"]} s; {out}/call.json'
  figures = json.loads((out / 'call.json').read_text())
  assert figures['flags']['accepted']
  assert [row.get('failed') for row in figures['kernels']['rows']] == [
      None] * 3
  for name in ('A', 'B', 'with_pallas', 'keras', 'C', 'with_stacked_grad'):
    stages = figures['steps'][name]['stages']
    assert stages['a_device_rate']['images_per_sec'] > 0, name
  assert figures['steps']['keras']['stages']['f_keras_fit'][
      'images_per_sec'] > 0
  assert figures['steps']['A']['variants']['depthwise=pallas_forward'][
      'of_baseline'] > 0
  summary = figures['summary']
  assert set(summary['of_A']) == {'B', 'keras', 'C'}
  assert summary['host_fed_of_keras_fit']['ratio'] > 0
  assert any(line.startswith('gpu_call: loading_spread: ') for line in lines)
