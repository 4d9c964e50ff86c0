"""What this machine has, read without loading TensorFlow, JAX or CUDA:
installed distributions, TPU chips, the NVIDIA driver's GPU models. The
backend choice, the compile cache and the hardware checks read them before
any framework loads."""

import glob
import importlib.metadata
import importlib.util
import os
import re
import subprocess

# What a TPU VM's chips show up as: /dev/accel* (v2 to v4), vfio (v5e on).
_TPU_DEVICE_FILES = ('/dev/accel0', '/dev/vfio/0')
_NVIDIA_GPUS = '/proc/driver/nvidia/gpus/*/information'


def installed(distribution):
  """The installed version of a pip distribution, or None."""
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return None


def jax_installed():
  return importlib.util.find_spec('jax') is not None


def tpu_attached():
  """Whether this host has TPU chips (a TPU VM or a Colab TPU runtime)."""
  return any(os.path.exists(p) for p in _TPU_DEVICE_FILES) or bool(
      glob.glob('/dev/accel*'))


def gpu_models():
  """The NVIDIA GPU models the driver lists, read without loading CUDA."""
  models = set()
  for path in glob.glob(_NVIDIA_GPUS):
    try:
      with open(path, encoding='utf-8', errors='replace') as f:
        models.update(m.group(1).strip() for m in re.finditer(
            r'^Model:\s*(.+)$', f.read(), re.M))
    except OSError:
      continue
  if not models and os.path.exists('/dev/nvidia0'):
    # No driver folder in /proc (a container's sandbox): nvidia-smi's names.
    models.update(_nvidia_smi_names() or ['NVIDIA GPU'])
  return sorted(models)


def _nvidia_smi_names():
  try:
    listing = subprocess.run(
        ['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
        capture_output=True, text=True, timeout=30, check=False).stdout
  except (OSError, subprocess.SubprocessError):
    return []
  return [line.strip() for line in listing.splitlines() if line.strip()]
