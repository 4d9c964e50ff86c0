"""launch.benchmark --policies: the first-run sweep over policies and XLA."""

import json
import re
import types

import pytest

from conftest import run_module
from pipeline.reports import benchmark

_TINY = ('--num_executions=1', '--config.model=efficientnet_tiny',
         '--config.image_size=32',
         '--config.global_batch_size=16', '--config.steps_per_execution=2',
         "--config.train_split=train[:64]")


@pytest.mark.slow
def test_sweep_prints_the_table_and_the_fastest(tmp_path, tfds_dir):
  """Two replicas: each policy trains on a synthetic batch, the fastest is
  named. The tiny network (B0 took 150 s in CI's slow tier), XLA off only:
  XLA's replica step is tested in test_steps.py."""
  output = tmp_path / 'sweep.json'
  result = run_module('launch.benchmark', '--policies=float32,mixed_bfloat16',
                      '--xla_settings=off', '--num_cpu_devices=2', f'--config.data_dir={tfds_dir}',
                      *_TINY, f'--output={output}')
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(output.read_text())
  rows = {(r['policy'], r['xla']): r for r in figures['rows']}
  assert sorted(rows) == [('float32', 'off'), ('mixed_bfloat16', 'off')]
  assert figures['replicas'] == 2
  for row in rows.values():
    assert row['images_per_sec'] > 0 and row['compile_s'] > 0
  fastest = max((r for r in figures['rows'] if 'images_per_sec' in r),
                key=lambda r: r['images_per_sec'])
  assert figures['fastest'] == fastest
  assert figures['speedup_over_float32'] == pytest.approx(
      fastest['images_per_sec'] / rows[('float32', 'off')]['images_per_sec'])
  assert (f'fastest: --policy={fastest["policy"]} --xla={fastest["xla"]}'
          in result.stdout)


@pytest.mark.parametrize('kind, replicas, settings', [
    ('TPU', 8, [('on', None)]),  # A TPU runs nothing but XLA programs.
    ('GPU', 2, [('off', None), ('on', None)]),  # Measured, for --save_policy.
    ('CPU', 2, [('off', None), ('on', None)]),
])
def test_the_sweep_tries_xla_both_ways_wherever_it_can_be_off(kind, replicas,
                                                              settings):
  hardware = types.SimpleNamespace(device_kind=kind, num_replicas=replicas)
  assert benchmark.xla_settings(hardware) == settings


@pytest.mark.parametrize('flag, message', [
    ('--policies=float32,fp8', "--policies: unknown policy 'fp8'; accepted: "
     'float32, mixed_float16'),
    ('--xla_settings=sometimes', '--xla_settings takes off, on or both'),
])
def test_sweep_bad_input_is_one_line(flag, message, tfds_dir):
  extra = ['--policies=float32'] if 'policies' not in flag else []
  result = run_module('launch.benchmark', flag, *extra,
                      f'--config.data_dir={tfds_dir}', *_TINY)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]


def test_a_cpu_sweep_is_kept_for_this_cpu_network_and_size(tfds_dir,
                                                           tmp_path):
  """--save_policy on a CPU keeps the sweep's fastest for the CPU's model
  name, the software, the network and its size, where --policy=auto then
  follows it and names it."""
  from pipeline.rules.speed import precision  # pylint: disable=g-import-not-at-top
  env = {'XDG_CACHE_HOME': str(tmp_path / 'cache')}
  result = run_module('launch.benchmark', '--policies=float32',
                      '--xla_settings=off', '--save_policy',
                      f'--output={tmp_path / "sweep.json"}',
                      f'--config.data_dir={tfds_dir}', *_TINY, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  cpu = precision.cpu_info()[0]
  assert re.search(rf'saved float32 for {re.escape(cpu)} and '
                   r'efficientnet_tiny-32px with .*: --policy=auto takes it '
                   r'there \(', result.stdout), result.stdout[-2000:]
  planned = run_module('launch.train', '--dry_run',
                       f'--workdir={tmp_path / "run"}',
                       f'--config.data_dir={tfds_dir}', *_TINY[1:], env=env)
  assert planned.returncode == 0, planned.stderr[-3000:]
  assert ('Precision: float32 (your sweep saved for this CPU, network, size '
          'and software: ') in planned.stderr


def test_operations_are_classed_by_their_layer():
  from pipeline.reports.benchmark import layer_times  # pylint: disable=g-import-not-at-top
  prefix = 'while/body/_1/gradient_tape/efficientnet_b0_1/efficientnetb0/'
  assert [layer_times.kind_of(op_type, prefix + name) for op_type, name in (
      ('_MklNativeDepthwiseConv2dNativeBackpropFilter',
       'block2a_dwconv/depthwise'),
      ('_MklMatMul', 'block2a_se_reduce/MatMul'),
      ('Sub', 'block2a_bn/sub_1'),
      ('_MklNativeConv2D', 'block2a_expand_conv/convolution'),
      ('_MklNativeConv2D', 'top_conv/convolution'),
      ('Cast', 'block2a_bn/Cast'),
      ('RealDiv', 'adam_w/truediv_495'),
      ('AddV2', 'block2a_add/add'))] == [
          'depthwise conv', 'squeeze-excite', 'batch norm', '1x1 conv',
          '1x1 conv', 'casts', 'optimizer', 'other']


@pytest.mark.slow  # Two policies profiled: CI's slow tier.
def test_the_sweep_profiles_each_policys_step_by_kind_of_layer(tfds_dir,
                                                                tmp_path):
  """--layer_times: a column a policy of a real profile's times, every
  kind of layer B0 has measured, the casts in the 16-bit column only."""
  output = tmp_path / 'sweep.json'
  result = run_module('launch.benchmark', '--policies=float32,mixed_bfloat16',
                      '--xla_settings=off', '--layer_times',
                      f'--output={output}', f'--config.data_dir={tfds_dir}',
                      *_TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ('ms a step by kind of layer (profiled; ratio: last / first)' in
          result.stdout), result.stdout[-2000:]
  rows = json.loads(output.read_text())['rows']
  float32, bfloat16 = (row['layer_ms_per_step'] for row in rows)
  for kind in ('depthwise conv', 'squeeze-excite', 'batch norm', '1x1 conv',
               'optimizer'):
    assert float32[kind] > 0 and bfloat16[kind] > 0, kind
  # The images' cast to float runs in both; 16 bits cast at every layer.
  assert bfloat16['casts'] > 10 * float32['casts'] > 0
