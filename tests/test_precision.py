"""The policy table, loss scaling placement, and float32 outputs."""

import json
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from conftest import REPO
from pipeline import backends
from pipeline.backends.tensorflow import xla as tf_xla
from pipeline.rules.speed import compile_cache
from pipeline.rules.config import request as request_lib
from pipeline.recipe import models
from pipeline.reports import saved_measurements
from pipeline.run import plan
from pipeline.rules.speed import precision
from pipeline.rules.speed import saved_policy
from pipeline.errors import UserError


@pytest.mark.parametrize('device_kind, capability, units, expected', [
    ('TPU', None, (), 'mixed_bfloat16'),
    ('GPU', (9, 0), (), 'mixed_bfloat16'),  # H100: measured faster.
    ('GPU', (8, 0), (), 'mixed_bfloat16'),
    ('GPU', (7, 5), (), 'mixed_float16'),  # Turing: no bfloat16 cores.
    ('GPU', (7, 0), (), 'mixed_float16'),
    ('GPU', (6, 1), (), 'float32'),
    ('CPU', None, (), 'float32'),
    # 16-bit units alone choose nothing: measured, AMX trained slower.
    ('CPU', None, ('amx_bf16', 'avx512_bf16'), 'float32'),
])
def test_auto_policy_table(device_kind, capability, units, expected):
  policy, reason = precision.choose_policy('auto', device_kind, capability,
                                           units)
  assert policy == expected
  assert reason


_SAPPHIRE_RAPIDS = ('model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ '
                    '2.70GHz\nflags\t: fpu avx512f avx512_bf16 amx_bf16 '
                    'amx_tile\n')


def _cpu_sweep(fastest, slower):
  """A CPU sweep of B0 at 128 px: `fastest` (policy, img/s) and `slower`."""
  rows = [{'policy': policy, 'xla': 'off', 'images_per_sec': rate,
           'compile_s': 30.0} for policy, rate in (fastest, slower)]
  return {'device_kind': 'CPU', 'gpu_name': None, 'model': 'efficientnet_b0',
          'image_size': 128, 'global_batch_size': 32, 'rows': rows,
          'fastest': rows[0], 'time': '2026-12-06 09:00'}


@pytest.mark.parametrize('fastest, slower', [
    (('mixed_bfloat16', 60.0), ('float32', 39.6)),
    (('float32', 39.6), ('mixed_bfloat16', 25.5)),
])
def test_auto_on_a_cpu_with_amx_follows_a_saved_measurement_either_way(
    tmp_path, monkeypatch, fastest, slower):
  """A CPU whose flags list AMX: with no measurement auto takes float32
  and says how to measure; a sweep saved for this CPU, software, network
  and size is followed, whichever policy won, and named; another size or
  network is not the measured one."""
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text(_SAPPHIRE_RAPIDS)
  real = precision.cpu_info
  monkeypatch.setattr(precision, 'cpu_info', lambda: real(str(cpuinfo)))
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  backend = backends.load('tensorflow')
  cpu = types.SimpleNamespace(device_kind='CPU', gpu_name=None,
                              gpu_compute_capability=None, num_replicas=1)
  request = request_lib.Request(policy='auto')
  step = saved_policy.step_of('efficientnet_b0', 128)
  unmeasured = precision.resolve(
      'auto', 'CPU', measured=plan._measured(request, cpu, backend, step))
  assert unmeasured.policy == 'float32'
  assert unmeasured.reason == (
      'CPU has bfloat16 units (amx_bf16, avx512_bf16), but no measurement '
      'for this network and size on this CPU and software says they train '
      "faster; on a 2-core AMX Xeon mixed_bfloat16 trained the default run "
      "at 0.58x float32's rate (BUILD_NOTES.md); measure: python -m "
      'launch.benchmark --policies=float32,mixed_bfloat16 --xla_settings=off '
      '--save_policy')
  line = saved_measurements.save_sweep(_cpu_sweep(fastest, slower))
  target = saved_policy.path('Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz',
                             backend.software(), step)
  assert line.endswith(f'--policy=auto takes it there ({target})')
  followed = precision.resolve(
      'auto', 'CPU', measured=plan._measured(request, cpu, backend, step))
  assert followed.policy == fastest[0]
  assert followed.reason == (
      'your sweep saved for this CPU, network, size and software: '
      f'{fastest[1]:,.0f} img/s against {slower[0]} {slower[1]:,.0f} '
      f'(efficientnet_b0 128 px, batch 32; {target})')
  # Another size, or an explicit policy: not the measured one.
  assert plan._measured(request, cpu, backend, saved_policy.step_of(
      'efficientnet_b0', 224)) is None
  assert plan._measured(request_lib.Request(policy='float32'), cpu, backend,
                        step) is None


@pytest.mark.parametrize('policy', precision.POLICIES[1:])
def test_explicit_policy_is_kept(policy):
  for device_kind in ('GPU', 'CPU'):
    assert precision.choose_policy(policy, device_kind)[0] == policy


@pytest.mark.parametrize('policy', ['float32', 'mixed_bfloat16', 'bfloat16'])
def test_explicit_policy_is_kept_on_tpu(policy):
  assert precision.choose_policy(policy, 'TPU')[0] == policy


@pytest.mark.parametrize('policy', ['mixed_float16', 'float16'])
def test_float16_is_refused_on_tpu(policy):
  with pytest.raises(UserError, match=f'--policy={policy} does not run on a '
                     'TPU, which computes in bfloat16; use '
                     '--policy=mixed_bfloat16'):
    precision.choose_policy(policy, 'TPU')


def test_sixteen_bit_policies():
  assert [p for p in precision.POLICIES[1:] if precision.is_16bit(p)] == [
      'mixed_float16', 'mixed_bfloat16', 'float16', 'bfloat16', 'rewrite']


def test_unknown_policy_names_value_and_choices():
  with pytest.raises(UserError, match=r"'fp8'.*mixed_bfloat16"):
    precision.choose_policy('fp8', 'CPU')


@pytest.mark.parametrize('policy, scaled', [
    ('float32', False), ('mixed_bfloat16', False), ('bfloat16', False),
    ('mixed_float16', True), ('float16', True)])
def test_loss_scaling_exactly_where_float16_computes(policy, scaled):
  optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1), policy)
  assert isinstance(optimizer,
                    keras.optimizers.LossScaleOptimizer) == scaled
  again = precision.wrap_optimizer(optimizer, policy)
  assert again is optimizer  # Never wrapped twice.


def test_amx_detection_reads_cpu_flags(tmp_path):
  flags = tmp_path / 'cpuinfo'
  flags.write_text(_SAPPHIRE_RAPIDS)
  assert precision.cpu_info(str(flags)) == (
      'Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz',
      ('amx_bf16', 'avx512_bf16'))
  flags.write_text('flags\t: fpu avx512f avx512_bf16\n')
  assert precision.cpu_info(str(flags)) == ('CPU', ('avx512_bf16',))
  assert precision.cpu_info(str(tmp_path / 'missing')) == ('CPU', ())


@pytest.mark.parametrize('policy', precision.KERAS_POLICIES[1:])
def test_model_outputs_float32_under_every_policy(policy):
  keras.mixed_precision.set_global_policy(policy)
  try:
    model = models.build_model('efficientnet_b0', 10, 32)
    assert model.layers[-1].compute_dtype == 'float32'
    images = np.random.randint(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    logits = model(images, training=False)
    probabilities = models.with_softmax(model)(images)
    assert logits.dtype == 'float32' and probabilities.dtype == 'float32'
    np.testing.assert_allclose(np.sum(probabilities, -1), 1.0, rtol=1e-5)
    # The backbone really computes in 16 bits where the policy says so.
    backbone = next(l for l in model.layers if isinstance(l, keras.Model))
    assert backbone.compute_dtype == {
        'float32': 'float32', 'mixed_float16': 'float16', 'float16': 'float16',
        'mixed_bfloat16': 'bfloat16', 'bfloat16': 'bfloat16'}[policy]
  finally:
    keras.mixed_precision.set_global_policy('float32')


# Trains the project's compiled multi-step function on a small conv net,
# first as it is, then with the graph rewrite on, and reports the dtype of
# every Conv2D/MatMul node in the graphs TensorFlow actually ran.
_REWRITE_PROBE = r'''
import collections, json, re, sys
from pipeline.run import environment
environment.prepare(['probe', '--policy=rewrite'])  # Before TF loads.
import keras, numpy as np, tensorflow as tf
from tensorflow.python.eager import context
from pipeline.backends.tensorflow import graph_rewrite, steps
from pipeline.recipe import objective
from pipeline.rules.speed import precision

def run_and_list_dtypes():
  keras.utils.set_random_seed(0)
  images = keras.Input((8, 8, 3), dtype='uint8')
  x = keras.layers.Rescaling(1 / 255)(images)
  x = keras.layers.Conv2D(8, 3, activation='relu')(x)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  x = keras.layers.Dense(16, activation='relu')(x)
  model = keras.Model(images, keras.layers.Dense(4, dtype='float32')(x))
  optimizer = keras.optimizers.SGD(0.1)
  optimizer.build(model.trainable_variables)
  train = steps.make_train_function(
      model, optimizer, tf.distribute.get_strategy(), 8,
      objective.Objective(4), tf.Variable(0, dtype=tf.int64),
      jit_compile=False)
  data = tf.data.Dataset.from_tensors(
      (np.zeros((8, 8, 8, 3), np.uint8), np.zeros(8, np.int32))).repeat()
  context.enable_run_metadata()
  loss = float(train(iter(data), tf.constant(2))['loss'])
  metadata = context.export_run_metadata()
  context.disable_run_metadata()
  found = collections.Counter()
  for function in metadata.function_graphs:
    for graph in [function.post_optimization_graph, *function.partition_graphs]:
      for node in graph.node:
        if 'Conv2D' in node.op or 'MatMul' in node.op:
          dtype = tf.dtypes.as_dtype(node.attr['T'].type).name
          # oneDNN and grappler fuse or rename the op (_FusedConv2D,
          # _MklNativeMatMul, ...) depending on the CPU: count it as itself.
          op = re.sub(r'^_(MklNativeFused|MklNative|MklFused|Mkl|Fused)', '',
                      node.op)
          found[f'{op}:{dtype}'] += 1
  return {'dtypes': dict(found), 'loss': loss,
          'keras_dtypes': sorted({l.compute_dtype for l in model.layers[1:]})}

result = {'float32': run_and_list_dtypes()}
result['target'] = graph_rewrite.enable_graph_rewrite('CPU')
result['rewrite'] = run_and_list_dtypes()
result['onednn'] = graph_rewrite.onednn_enabled()
print(json.dumps(result))
'''


def test_graph_rewrite_changes_op_dtypes_in_the_compiled_graph():
  """--policy=rewrite on CPU: Conv2D and MatMul really run in bfloat16.

  In a fresh process: oneDNN is switched on as TensorFlow loads, and the
  grappler option is process-global.
  """
  env = {k: v for k, v in os.environ.items() if k != 'TF_ENABLE_ONEDNN_OPTS'}
  result = subprocess.run([sys.executable, '-c', _REWRITE_PROBE], cwd=REPO,
                          env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['onednn'] and report['target'] == 'bfloat16'
  before, after = report['float32']['dtypes'], report['rewrite']['dtypes']
  assert before and all(k.endswith(':float32') for k in before), before
  for op in ('Conv2D', 'MatMul', 'Conv2DBackpropFilter'):
    assert after.get(f'{op}:bfloat16', 0) > 0, after
  # Keras itself stays float32: the rewrite happens below it.
  assert report['rewrite']['keras_dtypes'] == ['float32']
  assert np.isfinite(report['rewrite']['loss'])


@pytest.mark.parametrize('device_kind, dtype, scaled', [
    ('CPU', 'bfloat16', False), ('GPU', 'float16', True)])
def test_rewrite_policy_per_device(device_kind, dtype, scaled):
  assert precision.keras_policy('rewrite') == 'float32'
  assert precision.compute_dtype('rewrite', device_kind) == dtype
  assert precision.needs_loss_scaling('rewrite', device_kind) == scaled
  optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1), 'rewrite',
                                       device_kind)
  assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == scaled
  assert dtype in precision.graph_rewrite_reason(device_kind)


def test_rewrite_refuses_tpu_and_xla():
  with pytest.raises(UserError, match='TPU.*mixed_bfloat16'):
    precision.graph_rewrite_dtype('TPU')
  cpu = _stand_in('CPU')
  gpu = _stand_in('GPU', (9, 0))
  tpu = _stand_in('TPU', replicas=8)
  assert tf_xla.choose_xla('auto', gpu, 'rewrite')[0] is False
  assert tf_xla.choose_xla('off', cpu, 'rewrite')[0] is False
  assert tf_xla.choose_xla('auto', gpu, 'mixed_float16')[0] is True
  with pytest.raises(UserError, match='--xla=on cannot be combined'):
    tf_xla.choose_xla('on', gpu, 'rewrite')
  with pytest.raises(UserError, match='does not run on TPU'):
    tf_xla.choose_xla('auto', tpu, 'rewrite')


@pytest.mark.parametrize('backend, kind, replicas, expected, says', [
    ('tensorflow', 'TPU', 8, True, 'TPU programs are always compiled'),
    ('tensorflow', 'GPU', 1, True, 'single GPU: fused kernels help'),
    # XLA trains under MirroredStrategy (tests/test_steps.py) but was never
    # measured on GPUs: off until the user's sweep says (the test below).
    ('tensorflow', 'GPU', 2, False, '2 GPU replicas: not measured with XLA '
     'on this GPU; launch.benchmark --policies=mixed_bfloat16 --save_policy '
     '(--split_gpus=2 on one GPU) measures both and auto follows'),
    ('tensorflow', 'GPU', 8, False, '8 GPU replicas: not measured'),
    ('tensorflow', 'CPU', 1, False, 'CPU: XLA measured 8x slower'),
    ('tensorflow', 'CPU', 2, False, 'CPU: XLA measured 8x slower'),
    ('jax', 'TPU', 8, True, 'JAX compiles every program with XLA'),
    ('jax', 'GPU', 2, True, 'JAX compiles every program with XLA'),
    ('jax', 'CPU', 1, True, 'JAX compiles every program with XLA'),
])
def test_xla_auto_for_every_device_kind_and_replica_count(
    backend, kind, replicas, expected, says):
  hardware = _stand_in(kind, (9, 0) if kind == 'GPU' else None, replicas)
  on, reason = backends.load(backend).choose_xla('auto', hardware,
                                                 'mixed_bfloat16')
  assert on is expected and says in reason


def _stand_in(device_kind, capability=None, replicas=1, gpu_name=None):
  """The Hardware of a device that cannot exist here (a GPU, a TPU): only
  what the plan's rules read."""
  return types.SimpleNamespace(device_kind=device_kind, num_replicas=replicas,
                               gpu_compute_capability=capability,
                               gpu_name=gpu_name)


# (GPU, compute capability, TensorFlow, cuDNN, the user's environment) -> the
# policy, XLA, the compile cache and the lines a user reads. The GPUs stand
# in: none can exist here. CACHE is the folder under the per-user root, or
# the user's own; AUTOTUNE whether XLA_FLAGS gains the autotune folder.
H100 = 'NVIDIA H100 80GB HBM3'
CACHE = 'tf-2.21.0-cudnn-9.28.0.42/NVIDIA-H100-80GB-HBM3'
FIRST_RUN = ('per user, software and GPU; the first run on a machine '
             'compiles, for minutes on a GPU or TPU, later runs load')


@pytest.mark.parametrize('gpu, capability, tf_version, cudnn, environ, '
                         'policy, xla, cache, autotune, says', [
    (H100, (9, 0), '2.21.0', '9.28.0.42', {}, 'mixed_bfloat16', True, CACHE,
     True,
     ['GPU compute capability 9.0 has bfloat16 tensor cores: measured faster '
      'than mixed_float16 on an H100 (5,845 vs 5,677 img/s, B0 224 px) and '
      'as fast on an H200 on JAX (8,404 vs 8,407), and needs no loss '
      "scaling; your GPU's own sweep (launch.benchmark or launch.probe "
      '--save_policy) would win', 'single GPU: fused kernels help',
      f'compiled programs cached in {{root}}/{CACHE} ({FIRST_RUN})']),
    # A user's own XLA flags are kept, the autotune folder joins them.
    (H100, (9, 0), '2.21.0', '9.28.0.42',
     {'XLA_FLAGS': '--xla_gpu_enable_latency_hiding_scheduler=true'},
     'mixed_bfloat16', True, CACHE, True, [FIRST_RUN]),
    # A user's own caches win: nothing of theirs is changed.
    (H100, (9, 0), '2.21.0', '9.28.0.42',
     {'TF_XLA_FLAGS': '--tf_xla_persistent_cache_directory=/fast/xla',
      'XLA_FLAGS': '--xla_gpu_per_fusion_autotune_cache_dir=/fast/at'},
     'mixed_bfloat16', True, '/fast/xla', False,
     ['compiled programs cached in /fast/xla (your TF_XLA_FLAGS)']),
    ('NVIDIA A100-SXM4-40GB', (8, 0), '2.21.0', '9.28.0.42', {},
     'mixed_bfloat16', True,
     'tf-2.21.0-cudnn-9.28.0.42/NVIDIA-A100-SXM4-40GB', True,
     ['GPU compute capability 8.0 has bfloat16 tensor cores']),
    ('Tesla V100-SXM2-16GB', (7, 0), '2.21.0', '9.28.0.42', {},
     'mixed_float16', True, 'tf-2.21.0-cudnn-9.28.0.42/Tesla-V100-SXM2-16GB',
     True, ['GPU compute capability 7.0 has float16 tensor cores and no '
            'bfloat16 ones']),
    ('Tesla P100-PCIE-16GB', (6, 0), '2.21.0', '9.28.0.42', {}, 'float32',
     True, 'tf-2.21.0-cudnn-9.28.0.42/Tesla-P100-PCIE-16GB', True,
     ['GPU compute capability 6.0 has no 16-bit tensor cores']),
    ('NVIDIA RTX PRO 6000 Blackwell', (12, 0), '2.21.0', '9.28.0.42', {},
     'mixed_bfloat16', False,
     'tf-2.21.0-cudnn-9.28.0.42/NVIDIA-RTX-PRO-6000-Blackwell', True,
     ['compute capability 12.0 (Blackwell) with TensorFlow 2.21.0: its XLA '
      'fails with "PTX version 8.5 does not support target sm_120" '
      '(tensorflow#111958, fixed after 2.21.0); --xla=on to try anyway']),
    ('NVIDIA B200', (10, 0), '2.22.0', '9.28.0.42', {}, 'mixed_bfloat16', True,
     'tf-2.22.0-cudnn-9.28.0.42/NVIDIA-B200', True,
     ['single GPU: fused kernels help']),  # Fixed after 2.21.
    (H100, (9, 0), '2.21.0', '9.10.2.21', {}, 'mixed_bfloat16', True,
     'tf-2.21.0-cudnn-9.10.2.21/NVIDIA-H100-80GB-HBM3', True,
     ['cuDNN 9.10.2.21 is older than 9.24, whose XLA convolutions fail on '
      'TensorFlow 2.21 ("Autotuner could not find any supported configs"); '
      'pip install -r requirements-gpu.txt']),
])
def test_each_gpu_gets_its_policy_xla_and_compile_cache_with_the_reason(
    gpu, capability, tf_version, cudnn, environ, policy, xla, cache, autotune,
    says, tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  root = compile_cache.root()
  hardware = _stand_in('GPU', capability)
  chosen, policy_reason = precision.choose_policy('auto', 'GPU', capability)
  xla_on, xla_reason = tf_xla.choose_xla('auto', hardware, chosen,
                                       tensorflow_version=tf_version)
  warning = tf_xla.check_cudnn(xla_on, hardware, cudnn_version=cudnn)
  settings = compile_cache.choose('', backends.load('tensorflow'), environ,
                                  [gpu], True, f'tf-{tf_version}-cudnn-{cudnn}')
  assert (chosen, xla_on) == (policy, xla)
  assert settings.directory == os.path.join(root, cache)
  new = settings.environment
  if cache.startswith('/'):  # The user's: left as they set it.
    assert not new
  else:
    assert new['TF_XLA_FLAGS'] == (
        f'--tf_xla_persistent_cache_directory={root}/{cache}')
  if autotune:
    assert new['XLA_FLAGS'] == ' '.join(filter(None, [
        environ.get('XLA_FLAGS'),
        f'--xla_gpu_per_fusion_autotune_cache_dir={root}/{cache}/autotune']))
  else:
    assert 'XLA_FLAGS' not in new
  lines = [policy_reason, xla_reason, warning or '', settings.describe()]
  for line in says:
    line = line.format(root=root)
    assert any(line in text for text in lines), (line, lines)
  assert (warning is not None) == cudnn.startswith('9.10')


def _h100_sweep():
  """launch.benchmark's sweep result on an H100, where float16 came first."""
  rows = [{'policy': 'mixed_float16', 'xla': 'on', 'images_per_sec': 5905.0,
           'compile_s': 160.0},
          {'policy': 'mixed_bfloat16', 'xla': 'on', 'images_per_sec': 5845.0,
           'compile_s': 154.0},
          {'policy': 'float32', 'xla': 'on', 'images_per_sec': 2100.0,
           'compile_s': 120.0}]
  return {'device_kind': 'GPU', 'gpu_name': H100, 'model': 'efficientnet_b0',
          'image_size': 224, 'global_batch_size': 256, 'rows': rows,
          'fastest': rows[0], 'time': '2026-11-23 15:40'}


def test_a_saved_sweep_for_this_gpu_and_software_wins_over_the_rule(
    tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  software = backends.load('tensorflow').software()
  path = saved_policy.save(_h100_sweep(), H100, software)
  request = request_lib.Request(policy='auto')
  h100 = types.SimpleNamespace(device_kind='GPU', gpu_name=H100,
                               gpu_compute_capability=(9, 0), num_replicas=1)
  measured = plan._measured(request, h100, backends.load('tensorflow'), '')
  resolved = precision.resolve('auto', 'GPU', (9, 0), measured=measured)
  assert (resolved.policy, resolved.loss_scaling) == ('mixed_float16', True)
  assert resolved.reason == (
      'your sweep saved for this GPU and software: 5,905 img/s against '
      'float32 2,100, mixed_bfloat16 5,845 (efficientnet_b0 224 px, batch '
      f'256; {path})')
  # An explicit policy, another GPU model, other software or the JAX
  # backend: the rule.
  assert precision.resolve('mixed_bfloat16', 'GPU', (9, 0),
                           measured=measured).policy == 'mixed_bfloat16'
  a100 = types.SimpleNamespace(**dict(vars(h100), gpu_name='NVIDIA A100'))
  assert plan._measured(request, a100, backends.load('tensorflow'), '') is None
  assert saved_policy.load(H100, software + '-cudnn-9.30.0.1') is None
  assert plan._measured(request, h100, backends.load('jax'), '') is None


def _mirrored_h100_sweep(on, off, replicas=2):
  """A sweep over `replicas` replicas of H100s: mixed_bfloat16 with XLA
  `on` and `off` img/s."""
  sweep = _h100_sweep()
  rows = [{'policy': 'mixed_bfloat16', 'xla': 'on', 'images_per_sec': on},
          {'policy': 'mixed_bfloat16', 'xla': 'off', 'images_per_sec': off}]
  return dict(sweep, rows=rows, fastest=max(
      rows, key=lambda r: r['images_per_sec']), replicas=replicas)


@pytest.mark.parametrize('on, off, replicas, expected', [
    (11000.0, 9000.0, 2, True), (8000.0, 9000.0, 2, False),
    (11000.0, 9000.0, 1, False),  # One replica says nothing of Mirrored.
])
def test_a_sweep_over_replicas_decides_xla_under_mirrored_on_that_gpu(
    on, off, replicas, expected, tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  software = backends.load('tensorflow').software()
  path = saved_policy.save(_mirrored_h100_sweep(on, off, replicas), H100,
                           software)
  four_h100s = _stand_in('GPU', (9, 0), 4, H100)
  xla_on, reason = tf_xla.choose_xla('auto', four_h100s, 'mixed_bfloat16',
                                     tensorflow_version='2.21.0')
  assert xla_on is expected
  if replicas > 1:
    assert reason.startswith(
        'your sweep saved for this GPU and software over 2 replicas '
        f'(mixed_bfloat16): XLA on {on:,.0f} img/s, off {off:,.0f} ({path})')
    assert reason.endswith("; it compiles each replica's forward and "
                           'backward, the sum and update run after (steps.py)'
                           if xla_on else f'({path})')
  else:
    assert 'not measured with XLA on this GPU' in reason
  # A policy not swept, another GPU, an explicit setting, one GPU: no record.
  assert 'not measured' in tf_xla.choose_xla(
      'auto', four_h100s, 'mixed_float16', tensorflow_version='2.21.0')[1]
  a100s = _stand_in('GPU', (8, 0), 4, 'NVIDIA A100-SXM4-40GB')
  assert 'not measured' in tf_xla.choose_xla(
      'auto', a100s, 'mixed_bfloat16', tensorflow_version='2.21.0')[1]
  assert tf_xla.choose_xla('off', four_h100s, 'mixed_bfloat16') == (
      False, 'asked for with --xla=off')
  assert tf_xla.choose_xla('auto', _stand_in('GPU', (9, 0), 1, H100),
                           'mixed_bfloat16', tensorflow_version='2.21.0') == (
      True, 'single GPU: fused kernels help')


def test_a_sweep_over_logical_gpus_says_it_had_no_nccl(tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  software = backends.load('tensorflow').software()
  sweep = dict(_mirrored_h100_sweep(11000.0, 9000.0), logical_gpus=True)
  saved_policy.save(sweep, H100, software)
  xla_on, reason = tf_xla.choose_xla(
      'auto', _stand_in('GPU', (9, 0), 4, H100), 'mixed_bfloat16',
      tensorflow_version='2.21.0')
  assert xla_on and reason.startswith(
      'your sweep saved for this GPU and software over 2 logical replicas '
      'of one GPU, without NCCL: a sweep over real GPUs replaces it '
      '(mixed_bfloat16): XLA on 11,000 img/s')


def test_a_damaged_saved_sweep_falls_back_to_the_rule(tmp_path, monkeypatch,
                                                      caplog):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  path = saved_policy.save(_h100_sweep(), H100, 'tf-2.21.0')
  with open(path, 'r+', encoding='utf-8') as f:
    f.truncate(40)
  assert saved_policy.load(H100, 'tf-2.21.0') is None
  assert f'saved policy {path} is unreadable' in caplog.text


@pytest.mark.parametrize('requested, capability, expected, scaling', [
    ('auto', (9, 0), 'mixed_bfloat16', False),
    ('auto', (7, 0), 'mixed_float16', True),  # T4, V100: float16's cores.
    ('mixed_bfloat16', (7, 0), 'mixed_bfloat16', False),
    ('float16', (8, 0), 'float16', True),
])
def test_on_jax_a_gpu_gets_the_policy_tensorflow_gets(requested, capability,
                                                      expected, scaling):
  on_jax = precision.resolve(requested, 'GPU', capability,
                             on_backend=backends.load('jax').policy)
  on_tensorflow = precision.resolve(
      requested, 'GPU', capability,
      on_backend=backends.load('tensorflow').policy)
  assert (on_jax.policy, on_jax.loss_scaling) == (expected, scaling)
  assert on_jax == on_tensorflow


def test_on_jax_the_graph_rewrite_is_refused():
  with pytest.raises(UserError, match='--policy=rewrite is TensorFlow.s '
                     'graph rewrite and runs on --backend=tensorflow only'):
    precision.resolve('rewrite', 'GPU', (9, 0),
                      on_backend=backends.load('jax').policy)
