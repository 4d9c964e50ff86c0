"""The policy table, loss scaling placement, and float32 outputs."""

import keras
import numpy as np
import pytest

from pipeline import models
from pipeline import precision
from pipeline.errors import UserError


@pytest.mark.parametrize('device_kind, capability, amx, expected', [
    ('TPU', None, False, 'mixed_bfloat16'),
    ('GPU', (8, 0), False, 'mixed_float16'),
    ('GPU', (7, 0), False, 'mixed_float16'),
    ('GPU', (6, 1), False, 'float32'),
    ('CPU', None, False, 'float32'),
    ('CPU', None, True, 'mixed_bfloat16'),
])
def test_auto_policy_table(device_kind, capability, amx, expected):
  policy, reason = precision.choose_policy('auto', device_kind, capability, amx)
  assert policy == expected
  assert reason


@pytest.mark.parametrize('policy', precision.POLICIES[1:])
def test_explicit_policy_is_kept(policy):
  assert precision.choose_policy(policy, 'TPU')[0] == policy


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
  flags.write_text('flags\t: fpu avx512f amx_bf16 amx_tile\n')
  assert precision.cpu_has_amx(str(flags))
  flags.write_text('flags\t: fpu avx512f avx512_bf16\n')
  assert not precision.cpu_has_amx(str(flags))
  assert not precision.cpu_has_amx(str(tmp_path / 'missing'))


@pytest.mark.parametrize('policy', precision.POLICIES[1:])
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
    # The backbone really computes in the policy's dtype.
    backbone = next(l for l in model.layers if isinstance(l, keras.Model))
    assert backbone.compute_dtype == precision.compute_dtype(policy)
  finally:
    keras.mixed_precision.set_global_policy('float32')


def test_unknown_model_is_rejected():
  with pytest.raises(UserError, match=r"'efficientnet_b9'.*efficientnet_b7"):
    models.build_model('efficientnet_b9', 10, 32)
