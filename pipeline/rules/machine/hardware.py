"""The resolved hardware of a run, and what both backends find the same way.

`Hardware` is what a backend's `resolve_hardware` returns: the devices, the
strategy (tf.distribute) or mesh (JAX) that spans them, and this process's
place among the workers. The NVIDIA GPU checks and --gpus' syntax are
shared: each backend sees GPUs through its own runtime.
"""

import dataclasses
import os
import re
import subprocess
from typing import Optional

from pipeline.rules.machine.probes import installed
from pipeline.errors import UserError


@dataclasses.dataclass(frozen=True)
class Hardware:
  """The resolved devices and the strategy that spans them."""
  # A tf.distribute.Strategy on TensorFlow, a data-parallel mesh on JAX:
  # both count num_replicas_in_sync; only their backend uses more.
  strategy: object
  device_kind: str  # 'TPU', 'GPU' or 'CPU'
  num_workers: int = 1
  task_index: int = 0
  is_chief: bool = True
  gpu_compute_capability: Optional[tuple] = None
  gpu_name: Optional[str] = None  # The model, e.g. 'NVIDIA H100 80GB HBM3'.
  detail: str = ''
  # The engine that joined this process to the others of its run, where
  # there are any ('Slurm (job 7)': pipeline/rules/machine/cluster.py).
  cluster: str = ''
  # The GPUs this process takes of those its host shows it, and why
  # (placement.Binding.line); '' without any.
  gpu_share: str = ''
  # A TPU Node's workers (--tpu=NAME or grpc://) run on other hosts and read
  # only gs:// paths; a TPU VM's (--tpu=local) are this host.
  tpu_workers_remote: bool = False
  strategy_name: str = 'DefaultStrategy'  # As users know it.

  @property
  def num_replicas(self):
    return self.strategy.num_replicas_in_sync


def software():
  """The packages the run executes on, e.g. 'tensorflow-tpu 2.20.0, keras
  3.15.1, libtpu 0.0.14': what a user checks first on new hardware."""
  names = ('tensorflow', 'tensorflow-tpu', 'tensorflow-cpu', 'jax', 'keras',
           'libtpu')
  return ', '.join(f'{name} {installed(name)}' for name in names
                   if installed(name))


# The first GPU's device file: where the driver is loaded but nvidia-smi is
# not on PATH (some container images), it alone shows a GPU.
NVIDIA_DEVICE_FILE = '/dev/nvidia0'


def nvidia_gpus():
  """How many GPUs the NVIDIA driver lists (`nvidia-smi -L`); 1 where only
  /dev/nvidia0 shows one; 0 without either."""
  try:
    listing = subprocess.run(['nvidia-smi', '-L'], capture_output=True,
                             text=True, timeout=30, check=False).stdout
    count = sum(line.startswith('GPU ') for line in listing.splitlines())
    if count:
      return count
  except (OSError, subprocess.SubprocessError):
    pass
  return int(os.path.exists(NVIDIA_DEVICE_FILE))


def visible_gpu_count(environ=os.environ):
  """How many GPUs this process may see: CUDA_VISIBLE_DEVICES' entries
  where it is set (Slurm sets it per task), else the driver's count."""
  visible = environ.get('CUDA_VISIBLE_DEVICES')
  if visible is not None:
    return len([entry for entry in visible.split(',') if entry.strip()])
  return nvidia_gpus()


def gpu_memory_mib():
  """Each GPU's memory in MiB as the NVIDIA driver lists it (nvidia-smi),
  in index order; [] where nvidia-smi is missing or fails."""
  try:
    listing = subprocess.run(
        ['nvidia-smi', '--query-gpu=memory.total',
         '--format=csv,noheader,nounits'], capture_output=True, text=True,
        timeout=30, check=False).stdout
    return [int(line) for line in listing.split()]
  except (OSError, subprocess.SubprocessError, ValueError):
    return []


def check_no_unusable_gpus(framework, cause, install):
  """A UserError if the machine has NVIDIA GPUs that `framework` (e.g.
  'TensorFlow 2.21.0') cannot see, for `cause`, fixed by `install`: training
  on the CPU there is never what was meant."""
  count = nvidia_gpus()
  if not count:
    return
  raise UserError(
      f'this machine has {count} NVIDIA GPU(s) (nvidia-smi -L) but '
      f'{framework} sees none: {cause}; install {install}, or pass '
      '--allow_cpu to train on the CPU')


def select_gpus(spec, visible):
  """The indices into `visible` that --gpus names; '' names them all.

  Args:
    spec: comma-separated GPU indices or names, e.g. '0,2' or 'GPU:1'.
    visible: the names of the GPUs the backend sees, in index order (after
      CUDA_VISIBLE_DEVICES), e.g. ['/physical_device:GPU:0'].

  Raises:
    UserError: a GPU that is not visible, a repeated one, or a malformed name;
      the message lists the visible GPUs ('none' without any).
  """
  if not spec.strip():
    return list(range(len(visible)))
  listing = ', '.join(_short_gpu_name(n) for n in visible) or 'none'
  indices = []
  for token in (t.strip() for t in spec.split(',')):
    match = re.fullmatch(r'(?:.*GPU:)?(\d+)', token, re.IGNORECASE)
    index = int(match.group(1)) if match else None
    if index is None or index >= len(visible) or index in indices:
      problem = 'named twice' if index in indices else 'not a visible GPU'
      raise UserError(f'--gpus={spec}: {token!r} is {problem}; visible GPUs: '
                      f'{listing}')
    indices.append(index)
  return indices


def _short_gpu_name(name):
  return name[name.upper().rindex('GPU:'):] if 'GPU:' in name.upper() else name

