"""launch.probe and the compute path it measures, without TensorFlow.

CI runs this file in an environment of Python 3.12, jax 0.11.2, Keras,
ml-collections and absl-py alone (no TensorFlow), as a lent GPU machine
has; the JAX environment runs the import test too. Skipped where JAX is
not installed.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip('jax', reason='needs JAX')

from conftest import REPO  # pylint: disable=g-import-not-at-top,wrong-import-position
from conftest import run_module  # pylint: disable=g-import-not-at-top,wrong-import-position

# What the JAX backend compiles and runs every step.
COMPUTE_PATH = (
    'pipeline.backends.jax.programs', 'pipeline.backends.jax.mesh',
    'pipeline.backends.jax.staging', 'pipeline.backends.jax.ema',
    'pipeline.backends.jax.probe', 'pipeline.backends.jax.probe_stages',
    'pipeline.backends.hlo_cost',
    'pipeline.recipe.models', 'pipeline.recipe.optimizers',
    'pipeline.recipe.objective', 'pipeline.recipe.moving_average',
    'pipeline.rules.speed.precision', 'pipeline.rules.speed.schedule')

_WITHOUT_TENSORFLOW = '''
import importlib, importlib.abc, os, sys
class Absent(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name.split('.')[0] == 'tensorflow':
      raise ImportError('No module named tensorflow (made absent)')
sys.meta_path.insert(0, Absent())
os.environ['KERAS_BACKEND'] = 'jax'
for module in sys.argv[1:]:
  importlib.import_module(module)
print('imported', len(sys.argv) - 1)
'''


def _import_without_tensorflow(*modules):
  return subprocess.run([sys.executable, '-c', _WITHOUT_TENSORFLOW, *modules],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        check=False)


def test_the_compute_path_imports_where_tensorflow_cannot():
  """Every module of the step imports in a process where `import
  tensorflow` fails; one that needs TensorFlow (the hosts' tf.data input)
  fails there, so the check is live."""
  result = _import_without_tensorflow(*COMPUTE_PATH)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == f'imported {len(COMPUTE_PATH)}'
  needs_it = _import_without_tensorflow('pipeline.backends.jax.devices')
  assert needs_it.returncode == 1
  assert 'No module named tensorflow (made absent)' in needs_it.stderr


def test_the_probe_measures_every_stage_on_this_cpu(tmp_path):
  """The lent-machine command at a small size: it ends by itself within
  its budget, probe.json holding every stage's figures and Keras' own
  model.fit beside them."""
  result = run_module('launch.probe', '--image_size=32', '--batch_size=16',
                      '--budget_s=300', '--steps_per_execution=2',
                      '--executions=2', f'--out={tmp_path}', timeout=400)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert f'figures in {tmp_path}/probe.json' in result.stdout
  figures = json.loads((tmp_path / 'probe.json').read_text())
  stages = figures['stages']
  assert list(stages) == ['a_device_rate', 'b_staged_input', 'c_memory',
                          'd_flops', 'e_float16', 'f_keras_fit']
  for name, stage in stages.items():
    assert 'skipped' not in stage and 'failed' not in stage, (name, stage)
  assert figures['machine']['platform'] == 'cpu'
  a, b = stages['a_device_rate'], stages['b_staged_input']
  assert a['compile_s'] > 0 and a['images_per_sec'] > 0
  assert a['policy'] == 'mixed_bfloat16' and a['global_batch_size'] == 16
  for loop in ('one_program_per_step',
               'one_program_per_execution_runtime_trip_count'):
    assert b[loop]['images_per_sec'] > 0, b
    assert b[loop]['dispatch_returns_after_s'] <= b[loop]['execution_s']
  c = stages['c_memory']
  assert c['memory_limit_bytes'] is None  # A CPU has no such figure.
  assert c['step_arguments_bytes'] > 16e6  # B0's 4 M float32 weights.
  assert (c['steps_per_execution_8']['staged_input_bytes'] ==
          4 * c['steps_per_execution_2']['staged_input_bytes'] ==
          8 * 16 * (32 * 32 * 3 + 4))  # uint8 pixels, int32 labels.
  d = stages['d_flops']
  # B0 at 32 px, forward and backward: about 3 x 20 MFLOP an image.
  assert 45e6 < d['unoptimized_flops_per_image'] < 75e6, d
  assert 'unoptimized program' in d['unoptimized_counted']
  assert d['compiled_custom_calls'] == 0 and d['compiled_flops_per_image'] > 0
  e = stages['e_float16']
  assert e['steps'] == 3 * 2 and 0 <= e['skipped_steps'] <= e['steps']
  assert e['final_loss_scale'] >= 1 and e['images_per_sec'] > 0
  f = stages['f_keras_fit']
  assert f['policy'] == 'mixed_bfloat16' and f['images_per_sec'] > 0
  assert f['of_this_projects_device_rate'] > 0


def test_a_stage_that_would_not_fit_is_skipped_and_each_is_saved(
    monkeypatch):
  """Stand-in stages (a compile takes a minute): one that would outlast
  the budget, predicted from (a)'s compile time, is skipped with its
  reason; one that fails is a line, not an exception; the figures are
  saved after every stage."""
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('KERAS_BACKEND', 'jax')
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import probe  # pylint: disable=g-import-not-at-top

  def device_rate(runner, policy):
    runner.compile_s = 40.0
    return {'policy': policy}

  def fails(runner, policy):
    raise ValueError('broken')

  monkeypatch.setattr(probe, '_STAGES', {
      'a': ('device_rate', device_rate, 1),
      'b': ('fails', fails, 0),
      'c': ('one_compile', lambda runner, policy: {'ran': True}, 1)})
  saved = []
  config = default.get_config()
  config.image_size, config.global_batch_size = 8, 2
  runner = probe.Probe(config, 10, 2, 1, budget_s=50,
                       save=lambda r: saved.append(json.dumps(r)))
  results = runner.run('cb', 'float32')
  assert list(results['stages']) == ['a_device_rate', 'c_one_compile',
                                     'b_fails']
  assert results['stages']['b_fails']['failed'] == 'ValueError: broken'
  assert results['stages']['c_one_compile']['skipped'].endswith(
      'it needs about 60 s')
  assert len(saved) == 3 and '"c_one_compile"' not in saved[0]


def test_a_probe_cut_off_by_its_budget_says_so(tmp_path):
  result = run_module('launch.probe', '--image_size=32', '--batch_size=16',
                      '--budget_s=5', f'--out={tmp_path}', timeout=120)
  assert result.returncode == 2
  assert (f'probe: the budget of 5 s ran out mid-stage; {tmp_path}/probe.json'
          ' holds the stages before it') in result.stdout


def test_unknown_stages_are_one_line(tmp_path):
  result = run_module('launch.probe', '--stages=az', f'--out={tmp_path}',
                      timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --stages='az': letters of 'abcdef', e.g. abf")
