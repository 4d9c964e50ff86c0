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
from conftest import network_arithmetic  # pylint: disable=g-import-not-at-top,wrong-import-position
from conftest import run_module  # pylint: disable=g-import-not-at-top,wrong-import-position

# What the JAX backend compiles and runs every step.
COMPUTE_PATH = (
    'pipeline.backends.jax.programs', 'pipeline.backends.jax.mesh',
    'pipeline.backends.jax.staging', 'pipeline.backends.jax.ema',
    'pipeline.probe.runner', 'pipeline.probe.stages',
    'pipeline.probe.variants', 'pipeline.probe.repeats',
    'pipeline.probe.step_profile', 'pipeline.probe.kernel_times',
    'pipeline.backends.hlo_cost',
    'pipeline.recipe.models', 'pipeline.recipe.layers',
    'pipeline.recipe.optimizers', 'pipeline.rules.machine.peaks',
    'pipeline.rules.speed.saved_policy', 'pipeline.rules.speed.saved_rate',
    'pipeline.recipe.objective', 'pipeline.recipe.moving_average',
    'pipeline.rules.speed.precision', 'pipeline.rules.speed.step_counts')

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


# One probe run, as on a lent machine, at a small size (B0's blocks,
# narrower and fewer: every stage compiles its own program, a minute or
# more each on this CPU), with every option: each option's own run would
# compile and profile stage (a) again.
_FORMS = 'batch_norm=keras squeeze_excite=conv depthwise=conv_in_float32'


@pytest.mark.timeout(1500)  # Above the probe's budget: a busy CPU.
def test_the_probe_with_every_option_on_this_cpu(tmp_path, monkeypatch):
  """launch.probe with every stage, --repeats=2, two variants and
  --save_rate, as on a lent machine: it ends by itself within its budget,
  and each part's figures hold what the checks below say."""
  result = run_module(
      'launch.probe', '--image_size=32', '--batch_size=16', '--budget_s=1200',
      '--steps_per_execution=2', '--executions=2',
      '--config.model=efficientnet_tiny', '--repeats=2', '--save_rate',
      f'--variant={_FORMS}',
      f'--variant=--xla_dump_to={tmp_path / "xla_dump"}', f'--out={tmp_path}',
      env={'XDG_CACHE_HOME': str(tmp_path / 'cache')}, timeout=1400)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert f'figures in {tmp_path}/probe.json' in result.stdout
  figures = json.loads((tmp_path / 'probe.json').read_text())
  _check_every_stage(figures, tmp_path)
  _check_variants(figures, tmp_path)
  _check_repeats(figures, tmp_path, result, monkeypatch)


def _check_every_stage(figures, tmp_path):
  """Every stage's figures and Keras' own model.fit beside them, each
  against what the network implies."""
  stages = figures['stages']
  assert list(stages) == ['a_device_rate', 'h_host_fed', 'c_memory',
                          'd_flops', 'e_float16', 'f_keras_fit', 'g_profile']
  for name, stage in stages.items():
    assert 'skipped' not in stage and 'failed' not in stage, (name, stage)
  assert figures['machine']['platform'] == 'cpu'
  assert figures['config']['batch_norm'] == 'one_pass'
  parameters, depthwise, macs, _ = network_arithmetic('efficientnet_tiny',
                                                     32)
  a, h = stages['a_device_rate'], stages['h_host_fed']
  assert a['compile_s'] > 0 and a['images_per_sec'] > 0
  assert a['policy'] == 'mixed_bfloat16' and a['global_batch_size'] == 16
  assert h['images_per_sec'] > 0, h
  assert h['dispatch_returns_after_s'] <= h['execution_s']
  c = stages['c_memory']
  assert c['memory_limit_bytes'] is None  # A CPU has no such figure.
  # The weights, float32, are among the step's arguments.
  assert c['step_arguments_bytes'] >= 4 * parameters, (c, parameters)
  assert (c['steps_per_execution_8']['staged_input_bytes'] ==
          4 * c['steps_per_execution_2']['staged_input_bytes'] ==
          8 * 16 * (32 * 32 * 3 + 4))  # uint8 pixels, int32 labels.
  d = stages['d_flops']
  # Forward and backward: each multiply-add twice (2 FLOPs) forward, and
  # the gradients of a layer's input and of its weights backward; the
  # elementwise work (batch norm, activations) adds under 30% more (this
  # network measured 1.19x; B0 in the two-backend benchmark, 1.04x).
  assert 6 * macs * 0.95 < d['unoptimized_flops_per_image'] < 6 * macs * 1.3, (
      d, macs)
  assert 'unoptimized program' in d['unoptimized_counted']
  assert d['compiled_custom_calls'] == 0 and d['compiled_flops_per_image'] > 0
  e = stages['e_float16']
  assert e['steps'] == 3 * 2 and e['images_per_sec'] > 0
  # Each skipped step halves the scale from Keras' 2**15; none grows it
  # (that takes 2,000 finite steps in a row).
  assert e['final_loss_scale'] == 2.0 ** (15 - e['skipped_steps'])
  f = stages['f_keras_fit']
  assert f['model'] == 'keras.applications efficientnet_tiny'
  assert f['policy'] == 'mixed_bfloat16' and f['images_per_sec'] > 0
  # The peer's two timed epochs and (a)'s step timed before, between and
  # after them; each ratio from those rates (rounded to 0.1 and 0.001).
  peer = f['images_per_sec_each_epoch']
  assert len(peer) == 2 and f['images_per_sec'] == pytest.approx(
      sum(peer) / 2, abs=0.1)
  ours = f['this_projects_step_alternating']
  assert len(ours) == 3
  host_fed = h['images_per_sec']
  for ratio, mine in ((f['this_projects_step_against_it'], sum(ours) / 3),
                      (f['this_projects_host_fed_step_against_it'],
                       host_fed)):
    # Rates are printed to 0.1 image/s (0.05 either way), ratios to 0.001.
    expected = mine / f['images_per_sec']
    assert ratio == pytest.approx(expected, abs=expected * (
        0.05 / mine + 0.05 / f['images_per_sec']) + 5e-4)
  g = stages['g_profile']
  assert g['timed_on'].startswith('host threads running XLA:CPU thunks')
  assert g['steps_traced'] == 2 * 2 and g['unattributed_ms_per_step'] == 0
  # Each depthwise convolution runs forward, and the gradient of its input
  # (the first's too: its input is the stem's output, which needs one) and
  # of its filter.
  classes = g['by_class']
  for direction in ('forward', 'data gradient', 'filter gradient'):
    assert classes[f'depthwise convolution: {direction}'][
        'kernels_per_step'] == depthwise, (direction, classes)
  for expected in ('batch-norm statistics', 'squeeze-excite',
                   'optimizer update', '1x1 convolution: forward'):
    assert classes[expected]['ms_per_step'] > 0, (expected, classes)
  assert abs(sum(c['share'] for c in classes.values()) - 1) < 0.01
  assert g['kernels_per_step'] == sum(c['kernels_per_step']
                                      for c in classes.values())
  # At least the float32 weights read and written once a step of 16 images
  # (what bytes_moved counts is checked exactly on a small program below).
  assert g['bytes_per_image'] > parameters * 4 * 2 / 16, g['bytes_per_image']
  assert 'no figure for' in g['peak_bytes_per_sec']
  assert list((tmp_path / 'trace').rglob('*.xplane.pb'))


def test_the_probe_takes_a_model_family_by_name():
  """ResNet-50 by its config name: the project's step is built on it, and
  the peer stage (f) times is keras.applications' own ResNet-50 (built as
  the stage builds it; the stages themselves run end to end on the tiny
  EfficientNet above: compiling ResNet-50 here would take minutes)."""
  import keras  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import mesh  # pylint: disable=g-import-not-at-top
  from pipeline.probe import runner  # pylint: disable=g-import-not-at-top
  from pipeline.recipe import models  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.model, config.image_size, config.global_batch_size = (
      'resnet50', 32, 8)
  setup = runner.Setup(config, 10, 'float32',
                       mesh.DataParallel(jax.devices()[:1]))
  names = {layer.name for layer in models.backbone(setup.model).layers}
  assert {'conv1_conv', 'conv5_block3_out'} <= names
  peer = models.MODELS[config.model].with_its_top(config.model, 10,
                                                  (32, 32, 3))
  assert peer.name == 'resnet50' and peer.output.shape[-1] == 10
  assert isinstance(peer, keras.Model)


def _check_variants(figures, tmp_path):
  """Two variants: batch norm and squeeze-excite as Keras has them and
  depthwise convolutions computed in float32 (in this process, profiled,
  against the baseline timed again just before), and an XLA flag in a
  process of its own (the flag reaches it: XLA dumps its programs where it
  says)."""
  dump = tmp_path / 'xla_dump'
  variants = figures['variants']
  assert list(variants) == [f'--xla_dump_to={dump}', _FORMS]
  keras_forms = variants[_FORMS]
  assert keras_forms['images_per_sec'] > 0
  # Its ratio to the baseline timed just before it, from the unrounded
  # rates: the printed ones are rounded to 0.1 image/s (0.05 either way,
  # which moves a/b by up to 0.05 (1 + a/b) / b) and the ratio to 0.001.
  rate, baseline = (keras_forms['images_per_sec'],
                    keras_forms['baseline_images_per_sec'])
  assert keras_forms['of_baseline'] == pytest.approx(
      rate / baseline, abs=0.05 * (1 + rate / baseline) / baseline + 5e-4)
  # Keras' forms: squeeze-excite as convolutions, each a kernel of its own.
  ours = figures['stages']['g_profile']['by_class']
  theirs = keras_forms['profile']['by_class']
  assert theirs['squeeze-excite']['kernels_per_step'] != ours[
      'squeeze-excite']['kernels_per_step']
  # Every kernel still its layer's.
  assert keras_forms['profile']['unattributed_ms_per_step'] == 0
  flagged = variants[f'--xla_dump_to={dump}']
  assert flagged['xla_flags'] == f'--xla_dump_to={dump}'
  assert flagged['baseline'] == 'stage (a) of the probe that started it'
  rate, baseline = flagged['images_per_sec'], flagged['baseline_images_per_sec']
  assert baseline == figures['stages']['a_device_rate']['images_per_sec']
  assert flagged['of_baseline'] == pytest.approx(rate / baseline, abs=5e-4)
  assert any(dump.glob('*.txt')), 'the flag never reached XLA'
  assert not (tmp_path / 'variant-0' / 'xla_dump').exists()


def test_a_variant_that_names_no_config_key_is_one_line(tmp_path):
  result = run_module('launch.probe', '--variant=batch_nrom=keras',
                      f'--out={tmp_path}', timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --variant: variant 'batch_nrom=keras': 'batch_nrom' is not a "
      'config key (configs/default.py) nor policy')


def test_the_probe_saves_the_faster_policy_for_the_jax_route(tmp_path,
                                                               monkeypatch):
  """--save_policy on a GPU: the faster of (a) and (e) is kept where
  `--policy=auto` on the JAX route reads it (figures as a GPU's probe
  writes them; there is no GPU here). On a CPU it saves nothing."""
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('KERAS_BACKEND', 'jax')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  from pipeline.backends.jax import JaxBackend  # pylint: disable=g-import-not-at-top
  from pipeline.probe import runner as probe  # pylint: disable=g-import-not-at-top
  from pipeline.rules.speed import saved_policy  # pylint: disable=g-import-not-at-top
  results = {
      'machine': {'platform': 'gpu', 'device_kind': 'NVIDIA H200'},
      'config': {'model': 'efficientnet_b0', 'image_size': 224,
                 'global_batch_size': 256},
      'stages': {'a_device_rate': {'policy': 'mixed_bfloat16',
                                   'images_per_sec': 8174.0},
                 'e_float16': {'images_per_sec': 8408.0}}}
  assert 'saved mixed_float16' in probe.save_policy(results)
  policy, reason = saved_policy.load('NVIDIA H200', JaxBackend().software())
  assert policy == 'mixed_float16'
  assert 'mixed_bfloat16 8,174' in reason
  results['machine']['platform'] = 'cpu'
  assert probe.save_policy(results).startswith('no policy saved')


def test_a_stage_that_would_not_fit_is_skipped_and_each_is_saved(
    monkeypatch):
  """Stand-in stages (a compile takes a minute): one that would outlast
  the budget, predicted from (a)'s compile time, is skipped with its
  reason; one that fails is a line, not an exception; the figures are
  saved after every stage."""
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('KERAS_BACKEND', 'jax')
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.probe import runner as probe  # pylint: disable=g-import-not-at-top

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
                       save=lambda r, *_: saved.append(json.dumps(r)))
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
      "error: --stages='az': letters of 'acdefgh', e.g. ahf")


def test_the_profile_names_what_it_could_not_attribute():
  """A kernel whose instruction the compiled program lacks is counted as
  unattributed and named with its time, so a trace that disagrees with
  the program says where."""
  from pipeline.probe import kernel_times  # pylint: disable=g-import-not-at-top
  events = [('fusion.1', 'fusion_1', 0, 3_000_000),
            ('fusion.2', 'fusion_2', 3_000_000, 1_000_000),
            ('custom-call.7', 'custom-call.7', 4_000_000, 2_000_000)]
  figures = kernel_times.summarize(
      events, True, {'fusion.1': 'elementwise fusions',
                     'fusion.2': 'elementwise fusions'}, steps=2)
  assert figures['unattributed_ms_per_step'] == 1.0
  assert figures['unattributed_share'] == round(2 / 6, 4)
  assert figures['unattributed_ops'] == {'custom-call.7': 1.0}
  assert figures['by_class']['elementwise fusions']['ms_per_step'] == 2.0
  assert figures['kernel_ms_per_step'] == 3.0


def test_kernels_inside_command_buffers_are_classed_by_their_names():
  """On a GPU a kernel run inside a command buffer carries the buffer's
  name (command_buffer_N) as its hlo_op: it is classed by its own kernel
  name, XLA's sanitised name of its fusion (a '.__N' suffix of a launch
  too), or as a library kernel (cuDNN's, cuBLAS'); the time inside the
  buffers is stated. On a CPU there are none, and the profile says so."""
  from pipeline.probe import kernel_times  # pylint: disable=g-import-not-at-top
  classes = {'loop_multiply_fusion.3': 'batch norm, elementwise',
             'input_reduce_fusion': 'batch-norm statistics'}
  events = [('command_buffer_1306', 'loop_multiply_fusion_3', 0, 2_000_000),
            ('command_buffer_1306', 'input_reduce_fusion_1', 2_000_000,
             1_000_000),
            ('command_buffer_1306',
             'sm90_xmma_fprop_implicit_gemm_bf16_nhwc', 3_000_000, 500_000),
            ('input_reduce_fusion', 'input_reduce_fusion', 3_500_000,
             500_000),
            ('command_buffer_9', 'mystery_kernel', 4_000_000, 100_000)]
  figures = kernel_times.summarize(events, True, classes, steps=1)
  by_class = figures['by_class']
  assert by_class['batch norm, elementwise']['ms_per_step'] == 2.0
  assert by_class['batch-norm statistics']['ms_per_step'] == 1.5
  assert by_class[kernel_times.LIBRARY_CLASS]['ms_per_step'] == 0.5
  assert figures['unattributed_ops'] == {
      'command_buffer_9 (mystery_kernel)': 0.1}
  assert figures['command_buffers'] == {'kernel_ms_per_step_inside': 3.6,
                                        'share': round(3.6 / 4.1, 4)}
  on_cpu = kernel_times.summarize(events[3:4], False, classes, steps=1)
  assert on_cpu['command_buffers'] == 'none: XLA:CPU runs no command buffers'
  assert on_cpu['unattributed_share'] == 0.0


def _check_repeats(figures, tmp_path, result, monkeypatch):
  """--repeats=2: this process and one fresh process each compile and time
  (a) and profile it; probe.json holds each rate against their median, the
  spread, and which program the other stages used; --save_rate keeps the
  median where a run of the same step looks for it."""
  spread = figures['repeats']
  assert list(spread['processes']) == ['this process', 'fresh process 1']
  rates = [row['images_per_sec'] for row in spread['processes'].values()]
  assert rates[0] == figures['stages']['a_device_rate']['images_per_sec']
  fresh = json.loads((tmp_path / 'repeat-1' / 'probe.json').read_text())
  assert rates[1] == fresh['stages']['a_device_rate']['images_per_sec']
  assert 'g_profile' in fresh['stages']  # Each profiles its own step.
  assert spread['median_images_per_sec'] == pytest.approx(sum(rates) / 2)
  assert spread['spread'] == pytest.approx(
      abs(rates[0] - rates[1]) / (sum(rates) / 2), abs=1e-3)
  for row in spread['processes'].values():
    assert row['of_median'] == pytest.approx(
        row['images_per_sec'] / spread['median_images_per_sec'], abs=1e-3)
  assert spread['other_stages_used'].startswith("this process's program: ")
  assert 'probe: repeats: ' in result.stdout
  # --save_rate: the median, where a run of the same step looks for it.
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('KERAS_BACKEND', 'jax')
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import JaxBackend  # pylint: disable=g-import-not-at-top
  from pipeline.rules.speed import saved_rate  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.update(dict(model='efficientnet_tiny', image_size=32,
                     global_batch_size=16))
  key = saved_rate.step_key(config, config.image_size, 1, 'mixed_bfloat16')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  with open(saved_rate.path('CPU', JaxBackend().software(), key),
            encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['images_per_sec'] == spread['median_images_per_sec']
  assert saved['measured_by'].startswith(
      'launch.probe (stage a, median of 2 processes')


def test_an_outlier_process_is_explained_by_its_kernel_classes(tmp_path):
  """Three processes' figures, one 30% slow in its depthwise forward: the
  spread names that class with both times, the classes that agree are
  left out, and the autotuner's picks that differ are counted (files as a
  GPU's XLA writes them)."""
  from pipeline.probe import picks as picks_lib  # pylint: disable=g-import-not-at-top
  from pipeline.probe import repeats  # pylint: disable=g-import-not-at-top

  def profile(depthwise_ms):
    return {'by_class': {
        'depthwise convolution: forward': {'ms_per_step': depthwise_ms},
        'batch-norm statistics': {'ms_per_step': 4.6},
        'elementwise fusions': {'ms_per_step': 3.9}}}

  def picks(folder, algorithm):
    folder.mkdir()
    (folder / picks_lib.AUTOTUNE_FILE).write_text(
        'version: 3\n'
        'results {\n  device: "CUDA: 9.0"\n  hlo: "conv.1"\n  result {\n'
        f'    conv {{ algorithm: {algorithm} }}\n  }}\n}}\n'
        'results {\n  device: "CUDA: 9.0"\n  hlo: "conv.2"\n  result {\n'
        '    conv { algorithm: 7 }\n  }\n}\n')
    return str(folder)

  processes = [
      ('this process', {'images_per_sec': 8970.0, 'profile': profile(4.4)},
       picks(tmp_path / 'a', 3)),
      ('fresh process 1', {'images_per_sec': 6286.0,
                           'profile': profile(16.6)},
       picks(tmp_path / 'b', 11)),
      ('fresh process 2', {'images_per_sec': 8941.0,
                           'profile': profile(4.41)},
       picks(tmp_path / 'c', 3))]
  spread = repeats.summarize(processes)
  assert spread['median_images_per_sec'] == 8941.0
  assert spread['spread'] == round((8970 - 6286) / 8941, 3)
  assert spread['outliers'] == 1
  slow = spread['processes']['fresh process 1']
  assert slow['of_median'] == round(6286 / 8941, 3)
  assert slow['kernel_classes_that_differ'] == {
      'depthwise convolution: forward': {
          'ms_per_step': 16.6, 'median_process_ms_per_step': 4.41}}
  assert slow['autotune_picks_that_differ'] == {'differ': 1, 'compared': 2}
  assert 'kernel_classes_that_differ' not in spread['processes'][
      'this process']
  # Where no GPU wrote picks, and no profile was asked for, it says so.
  bare = repeats.summarize([('a', {'images_per_sec': 100.0}, ''),
                            ('b', {'images_per_sec': 50.0}, ''),
                            ('c', {'failed': 'exit 1: boom'}, '')])
  assert bare['processes']['c'] == {'failed': 'exit 1: boom'}
  assert bare['processes']['b']['kernel_classes_that_differ'] == (
      'no profile to compare: ask for stage g')
  assert bare['processes']['b']['autotune_picks_that_differ'].startswith(
      'no autotuner results written')


def test_the_bytes_a_program_moves_are_its_operands_and_results():
  """bytes_moved counts what each kernel reads and writes, once: x @ w + b
  of f32[8, 32], f32[32, 16] and f32[16] is two kernels on XLA:CPU (the
  product, then the fused add), so x, w and the product's 512 bytes, then
  the product again, b and the sum's 512: 4,672 bytes, where one fused
  kernel would move 3,648."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from pipeline.probe import step_profile  # pylint: disable=g-import-not-at-top
  program = jax.jit(lambda x, w, b: x @ w + b).lower(
      jnp.ones((8, 32)), jnp.ones((32, 16)), jnp.ones((16,))).compile()
  found = step_profile.instructions(program.as_text())
  classes = step_profile.classify(found, {}, 8)
  assert len(classes) == 2, classes
  assert step_profile.bytes_moved(found, classes) == (
      4 * (8 * 32 + 32 * 16 + 8 * 16) + 4 * (8 * 16 + 16 + 8 * 16))
