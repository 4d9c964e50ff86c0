"""Precision policy: which dtypes compute, which hold variables, and why.

Variables always stay float32; the model's head and the loss are float32 under
every policy (see models.py). Loss scaling is needed exactly where the compute
dtype is float16: its range is too small for small gradients, while bfloat16
has float32's range.
"""

import keras

from pipeline.errors import UserError

POLICIES = ('auto', 'float32', 'mixed_float16', 'mixed_bfloat16', 'float16',
            'bfloat16')


def cpu_has_amx(cpuinfo_path='/proc/cpuinfo'):
  """True if the host CPU has AMX bfloat16 tiles (Sapphire Rapids and newer)."""
  try:
    with open(cpuinfo_path) as f:
      return 'amx_bf16' in f.read()
  except OSError:
    return False


def choose_policy(requested, device_kind, gpu_compute_capability=None,
                  has_amx=False):
  """Returns (policy name, reason) for `requested` on this hardware."""
  if requested not in POLICIES:
    raise UserError(f'unknown policy {requested!r}; accepted: '
                    f'{", ".join(POLICIES)}')
  if requested != 'auto':
    return requested, 'asked for with --policy'
  if device_kind == 'TPU':
    return 'mixed_bfloat16', 'TPU matrix units compute in bfloat16'
  if device_kind == 'GPU':
    if gpu_compute_capability and tuple(gpu_compute_capability) >= (7, 0):
      major, minor = gpu_compute_capability
      return 'mixed_float16', (f'GPU compute capability {major}.{minor} has '
                               'float16 tensor cores')
    return 'float32', 'GPU older than compute capability 7.0 gains nothing '\
        'from float16'
  if has_amx:
    return 'mixed_bfloat16', 'CPU has AMX bfloat16 units'
  return 'float32', ('CPU without AMX: bfloat16 runs no faster than float32 '
                     'here (measured, BUILD_NOTES.md)')


def compute_dtype(policy):
  return keras.mixed_precision.Policy(policy).compute_dtype


def needs_loss_scaling(policy):
  """Dynamic loss scaling exactly where the compute dtype is float16."""
  return compute_dtype(policy) == 'float16'


def wrap_optimizer(optimizer, policy):
  """Adds dynamic loss scaling for float16 compute, never twice."""
  if (needs_loss_scaling(policy) and
      not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
    return keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer
