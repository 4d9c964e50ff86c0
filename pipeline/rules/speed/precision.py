"""Precision policy: which dtypes compute, which hold variables, and why.

Variables always stay float32; the model's head and the loss are float32 under
every policy (see recipe/models/). Loss scaling is needed exactly where the compute
dtype is float16: its range is too small for small gradients, while bfloat16
has float32's range.
"""

import dataclasses
from typing import Optional

import keras

from pipeline.errors import UserError

# Keras dtype policies ('auto' is resolved per device by choose_policy).
KERAS_POLICIES = ('auto', 'float32', 'mixed_float16', 'mixed_bfloat16',
                  'float16', 'bfloat16')
# Keras stays float32; TensorFlow's graph optimizer rewrites eligible ops.
REWRITE = 'rewrite'
POLICIES = KERAS_POLICIES + (REWRITE,)


# The host CPU's 16-bit units, by /proc/cpuinfo's flag: AMX's bfloat16
# tiles (Sapphire Rapids and newer), AVX-512's bfloat16 dot products.
CPU_SIXTEEN_BIT_FLAGS = ('amx_bf16', 'avx512_bf16')
# What a CPU with 16-bit units measured without a measurement of its own:
# bfloat16 slower (a 2-core Sapphire Rapids Xeon, TensorFlow 2.21 with
# oneDNN, the default run at 5 epochs in fresh processes: 198-204 img/s
# against float32's 341-354; keras.applications' own B0 with model.fit:
# 0.62x; 224 px, batch 32: 0.61x).
CPU_UNMEASURED = ('no measurement for this network and size on this CPU '
                  'and software says they train faster; on a 2-core AMX '
                  'Xeon mixed_bfloat16 trained the default run at 0.58x '
                  "float32's rate (BUILD_NOTES.md); measure: python -m "
                  'launch.benchmark --policies=float32,mixed_bfloat16 '
                  '--xla_settings=off --save_policy')


def cpu_info(cpuinfo_path='/proc/cpuinfo'):
  """(the host CPU's model name, its 16-bit units of
  CPU_SIXTEEN_BIT_FLAGS) from /proc/cpuinfo; ('CPU', ()) where unreadable."""
  try:
    with open(cpuinfo_path) as f:
      text = f.read()
  except OSError:
    return 'CPU', ()
  names = [line.split(':', 1)[1].strip() for line in text.splitlines()
           if line.startswith('model name')]
  flags = set(text.split())
  return (names[0] if names else 'CPU',
          tuple(flag for flag in CPU_SIXTEEN_BIT_FLAGS if flag in flags))


def choose_policy(requested, device_kind, gpu_compute_capability=None,
                  cpu_units=(), requested_from='--policy'):
  """Returns (policy name, reason) for `requested` on this hardware;
  `cpu_units`: the host CPU's 16-bit units (cpu_info), which alone never
  choose 16 bits (a measurement does: resolve's `measured`);
  `requested_from`: where a named policy came from, for its reason."""
  if requested not in POLICIES:
    raise UserError(f'unknown policy {requested!r}; accepted: '
                    f'{", ".join(POLICIES)}')
  if requested == REWRITE:
    graph_rewrite_dtype(device_kind)  # A one-line error on a TPU.
  if device_kind == 'TPU' and requested in ('mixed_float16', 'float16'):
    # TPUs compute in bfloat16, not float16: "use mixed_bfloat16 on TPUs"
    # (https://www.tensorflow.org/guide/mixed_precision).
    raise UserError(f'--policy={requested} does not run on a TPU, which '
                    'computes in bfloat16; use --policy=mixed_bfloat16 '
                    '(or auto)')
  if requested != 'auto':
    return requested, (f'asked for with {requested_from}'
                       if requested_from.startswith('--') else requested_from)
  if device_kind == 'TPU':
    return 'mixed_bfloat16', 'TPU matrix units compute in bfloat16'
  if device_kind == 'GPU':
    return _gpu_policy(gpu_compute_capability)
  if cpu_units:
    return 'float32', (f'CPU has bfloat16 units ({", ".join(cpu_units)}), '
                       f'but {CPU_UNMEASURED}')
  return 'float32', ('CPU without 16-bit units: bfloat16 runs no faster '
                     'than float32 here (measured, BUILD_NOTES.md)')


def _gpu_policy(capability):
  """(policy, reason) on a GPU of compute capability `capability`.

  bfloat16 tensor cores came with compute capability 8.0 (Ampere): on an
  H100 under TensorFlow mixed_bfloat16 trained B0 (224 px, batch 256, XLA)
  at 5,845 img/s against mixed_float16's 5,677; on an H200 under JAX the
  two ran 8,404 and 8,407 (the probe, one call; another call 8,174 against
  8,408: within the spread between calls). bfloat16 needs no loss scaling
  and is what TPUs use. A GPU's own measurement, saved by either backend's
  tool, wins (saved_policy.py). Volta and Turing (7.x) have float16 tensor
  cores only.
  """
  capability = tuple(capability or (0, 0))
  where = f'GPU compute capability {capability[0]}.{capability[1]}'
  if capability >= (8, 0):
    return 'mixed_bfloat16', (
        f'{where} has bfloat16 tensor cores: measured faster than '
        'mixed_float16 on an H100 (5,845 vs 5,677 img/s, B0 224 px) and '
        'as fast on an H200 on JAX (8,404 vs 8,407), and needs no loss '
        'scaling; your GPU\'s own sweep (launch.benchmark or launch.probe '
        '--save_policy) would win')
  if capability >= (7, 0):
    return 'mixed_float16', (f'{where} has float16 tensor cores and no '
                             'bfloat16 ones')
  return 'float32', f'{where} has no 16-bit tensor cores'


@dataclasses.dataclass(frozen=True)
class Precision:
  """The resolved policy: what computes in which dtype, and why."""
  policy: str  # One of POLICIES but 'auto'.
  reason: str
  compute_dtype: str
  loss_scaling: bool
  graph_rewrite: Optional[str] = None  # What the rewrite does, if it is on.

  @property
  def sixteen_bit(self):
    return is_16bit(self.policy, self.compute_dtype)


def resolve(requested, device_kind, gpu_compute_capability=None,
            measured=None, on_backend=None, requested_from='--policy'):
  """The Precision for --policy=`requested` on this hardware, or UserError.
  `measured`: (policy, reason) saved for this GPU, or this CPU, network
  and size (saved_policy.py), which `auto` takes over the rule;
  `on_backend(requested, policy, reason)`: the backend's adjustment
  (Backend.policy)."""
  policy, reason = choose_policy(requested, device_kind,
                                 gpu_compute_capability, cpu_info()[1],
                                 requested_from)
  if requested == 'auto' and measured:
    policy, reason = measured
  if on_backend:
    policy, reason = on_backend(requested, policy, reason)
  return Precision(
      policy, reason, compute_dtype(policy, device_kind),
      needs_loss_scaling(policy, device_kind),
      graph_rewrite_reason(device_kind) if policy == REWRITE else None)


def is_16bit(policy, dtype=None):
  """True if `policy` computes in 16 bits (on a GPU, for 'rewrite')."""
  return (dtype or compute_dtype(policy, 'GPU')) in ('float16', 'bfloat16')


def xla_rule(policy, requested, device_kind):
  """(False, reason) where `policy` rules XLA out; None where it does not.

  Grappler, which does the graph rewrite, never sees a function XLA
  compiles: the rewrite would silently do nothing.
  """
  if policy != REWRITE:
    return None
  graph_rewrite_dtype(device_kind)  # Refuses a TPU.
  if requested == 'on':
    raise UserError('--xla=on cannot be combined with --policy=rewrite: '
                    "TensorFlow's mixed precision rewrite does not run on "
                    'XLA-compiled functions; use --xla=auto or off, or a '
                    'mixed_* policy with XLA')
  return False, ('--policy=rewrite: the graph rewrite does not run on '
                 'XLA-compiled functions')


def apply(resolved):
  """Sets this process's Keras policy before any model is built (the graph
  rewrite is TensorFlow's to turn on)."""
  keras.mixed_precision.set_global_policy(keras_policy(resolved.policy))


def compute_dtype(policy, device_kind=None):
  """The dtype the model computes in; for 'rewrite', what the rewrite picks."""
  if policy == REWRITE:
    return graph_rewrite_dtype(device_kind)
  return keras.mixed_precision.Policy(policy).compute_dtype


def needs_loss_scaling(policy, device_kind=None):
  """Dynamic loss scaling exactly where the compute dtype is float16."""
  return compute_dtype(policy, device_kind) == 'float16'


def wrap_optimizer(optimizer, policy, device_kind=None):
  """Adds dynamic loss scaling for float16 compute, never twice."""
  if (needs_loss_scaling(policy, device_kind) and
      not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
    return keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


# --- graph rewrite: TensorFlow's automatic mixed precision -------------------

# The grappler switch per device: float16 with tensor cores on GPUs (the
# rewrite enable_mixed_precision_graph_rewrite used to turn on), bfloat16
# through oneDNN on CPUs.
REWRITE_OPTIONS = {'GPU': ('auto_mixed_precision', 'float16'),
                    'CPU': ('auto_mixed_precision_onednn_bfloat16', 'bfloat16')}


def keras_policy(policy):
  """The Keras global policy for `policy`: float32 under the graph rewrite."""
  return 'float32' if policy == REWRITE else policy


def graph_rewrite_dtype(device_kind):
  """The dtype the graph rewrite computes in on `device_kind`, or UserError."""
  if device_kind not in REWRITE_OPTIONS:
    raise UserError(f'--policy=rewrite does not run on {device_kind}; it '
                    'needs a GPU or a CPU (TPUs compute in bfloat16 with '
                    '--policy=mixed_bfloat16)')
  return REWRITE_OPTIONS[device_kind][1]


def graph_rewrite_reason(device_kind):
  """One line on what the graph rewrite does on `device_kind`."""
  dtype = graph_rewrite_dtype(device_kind)
  how = ('with dynamic loss scaling' if dtype == 'float16' else
         "(oneDNN's auto mixed precision)")
  return (f'Keras float32; TensorFlow rewrites eligible ops in the compiled '
          f'graph to {dtype} {how}')
