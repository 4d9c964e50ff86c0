"""When TensorFlow compiles the training step with XLA, on evidence."""

from absl import logging

from pipeline import backends
from pipeline.backends.tensorflow import devices
from pipeline.rules.speed import precision
from pipeline.rules.speed import saved_policy


def choose_xla(requested, hardware, policy=None, tensorflow_version=None,
               cudnn_version=None, saved=None):
  """Returns (on, reason) for --xla=auto|on|off on this hardware, warning
  where the cuDNN installed fails XLA's convolutions (`tensorflow_version`,
  `cudnn_version`: the installed ones unless given; `saved`: the user's
  sweep, saved_policy.load_xla's result, loaded unless given; for tests)."""
  on, reason = _choose(requested, hardware, policy, tensorflow_version, saved)
  check_cudnn(on, hardware, cudnn_version)
  if on and hardware.device_kind != 'TPU' and hardware.num_replicas > 1:
    reason += ("; it compiles each replica's forward and backward, the sum "
               'and update run after (steps.py)')
  return on, reason


def _choose(requested, hardware, policy, tensorflow_version, saved):
  ruled = precision.xla_rule(policy, requested, hardware.device_kind)
  if ruled:
    return ruled
  if hardware.device_kind == 'TPU':
    return True, 'TPU programs are always compiled by XLA'
  if requested == 'on':
    return True, 'asked for with --xla=on'
  if requested == 'off':
    return False, 'asked for with --xla=off'
  if hardware.device_kind != 'GPU':
    return False, ('CPU: XLA measured 8x slower than TF kernels here '
                   '(BUILD_NOTES.md)')
  blackwell = _blackwell_on_tf_2_21(hardware, tensorflow_version)
  if blackwell:
    return False, blackwell
  if hardware.num_replicas == 1:
    return True, 'single GPU: fused kernels help'
  if saved is None and hardware.gpu_name:
    saved = saved_policy.load_xla(
        hardware.gpu_name, backends.load('tensorflow').software(), policy)
  if saved:
    return saved
  # Each replica's forward and backward compile (steps.py); it trains over
  # 2 logical CPUs, but no GPU has measured it against TF's kernels yet.
  return False, (f'{hardware.num_replicas} GPU replicas: not measured with '
                 'XLA on this GPU; launch.benchmark --policies='
                 f'{policy or "POLICY"} --save_policy (--split_gpus=2 on one '
                 'GPU) measures both and auto follows')


def _blackwell_on_tf_2_21(hardware, tensorflow_version=None):
  """Why XLA stays off on a Blackwell GPU (compute capability 10.x, 12.x)
  under TensorFlow 2.21, or None: its XLA crashes there with "PTX version
  8.5 does not support target sm_120" (tensorflow#111958; fixed in
  openxla/xla#48532 after 2.21.0)."""
  capability = hardware.gpu_compute_capability
  if hardware.device_kind != 'GPU' or not capability or capability[0] not in (
      10, 12):
    return None
  version = tensorflow_version or devices.tensorflow_version()
  if not version.startswith('2.21'):
    return None
  return (f'compute capability {capability[0]}.{capability[1]} (Blackwell) '
          f'with TensorFlow {version}: its XLA fails with "PTX version 8.5 '
          'does not support target sm_120" (tensorflow#111958, fixed after '
          '2.21.0); --xla=on to try anyway')


def check_cudnn(xla, hardware, cudnn_version=None):
  """One warning line where XLA runs on a GPU with a cuDNN older than 9.24
  (`cudnn_version`: the installed wheel's unless given, for tests): TF
  2.21's XLA convolutions then fail with "Autotuner could not find any
  supported configs" (aws/deep-learning-containers#6418). Returns it."""
  if not xla or hardware.device_kind != 'GPU':
    return None
  version = cudnn_version or backends.installed('nvidia-cudnn-cu12')
  if not version or _release(version) >= (9, 24):
    return None
  line = (f'cuDNN {version} is older than 9.24, whose XLA convolutions fail '
          'on TensorFlow 2.21 ("Autotuner could not find any supported '
          'configs"); pip install -r requirements-gpu.txt')
  logging.warning('%s', line)
  return line


def _release(version):
  return tuple(int(part) for part in version.split('.')[:2])
