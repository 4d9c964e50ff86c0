"""What Slurm's variables say of a job step's tasks, its GPUs and its
nodes, for cluster.py's SlurmCluster.

Importable without TensorFlow or JAX: pure functions of the environment.
"""

import re

from pipeline.errors import UserError
from pipeline.errors import first_line


def _integer(environ, name):
  value = environ.get(name, '')
  try:
    return int(value) if value != '' else None
  except ValueError:
    raise UserError(f'{name}={value!r} must be an integer') from None


def gpus(environ):
  """What Slurm gave a step's task: --gpus-per-task (Slurm 22.05 says so in
  SLURMD_TRES_BIND, gpu:per_task:2; later ones in SLURM_GPUS_PER_TASK,
  which may name a type, a100:2), the GPUs its node has for the step
  (SLURM_GPUS_ON_NODE), and how they are bound (gpu:none,
  gpu:closest)."""
  bind = environ.get('SLURMD_TRES_BIND', '')
  bind = bind.split('gpu:', 1)[1].split(',')[0] if 'gpu:' in bind else ''
  per_task = environ.get('SLURM_GPUS_PER_TASK', '').rsplit(':', 1)[-1] or (
      bind.split(':')[-1] if bind.startswith('per_task:') else '')
  try:
    return {'gpus_per_task': int(per_task) if per_task else None,
            'gpus_on_node': _integer(environ, 'SLURM_GPUS_ON_NODE'),
            'gpu_bind': f'gpu:{bind}' if bind else ''}
  except ValueError:
    raise UserError(f'Slurm says {per_task!r} GPUs per task '
                    '(SLURM_GPUS_PER_TASK, SLURMD_TRES_BIND): not a count') \
        from None


def layout(environ):
  """How the step placed its tasks on its nodes: 'block' (Slurm's default)
  or 'cyclic'; anything else (plane, arbitrary, a host file) as named."""
  if environ.get('SLURM_HOSTFILE'):
    return 'a host file (SLURM_HOSTFILE)'
  method = environ.get('SLURM_DISTRIBUTION', 'block').split(':')[0]
  return method if method in ('block', 'cyclic') else (
      f'SLURM_DISTRIBUTION={environ["SLURM_DISTRIBUTION"]}')


def hostnames(node_list):
  """Slurm's compressed node list as names ('gpu[01-02],gpu-b7' -> gpu01,
  gpu02, gpu-b7), as Slurm's `scontrol show hostnames` expands it, by
  python-hostlist: a task in a container (Pyxis, Apptainer) has no
  scontrol."""
  # Here, not at the top: the backend's choice reads this module where
  # python-hostlist is not installed (launch.probe's environment).
  import hostlist  # pylint: disable=g-import-not-at-top
  try:
    return hostlist.expand_hostlist(node_list)
  except hostlist.BadHostlist as e:
    raise UserError(f'Slurm\'s node list {node_list!r} does not expand '
                    f'({first_line(e)}); expected names and ranges such as '
                    'gpu[01-04,07],cpu-a1') from None


def expand_counts(text):
  """Slurm's tasks per node as a list: '2(x3),1' -> [2, 2, 2, 1]."""
  counts = []
  for count, repeat in re.findall(r'(\d+)(?:\(x(\d+)\))?', text):
    counts.extend([int(count)] * int(repeat or 1))
  return counts
