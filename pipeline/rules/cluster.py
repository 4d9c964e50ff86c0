"""Which engine started this process beside others, and how they join.

A run past one host is the same command started on every host by
something: Slurm's `srun`, Open MPI's `mpirun`, Kubernetes (an indexed Job,
a JobSet, Kubeflow Trainer, XPK), GKE's TPU node pools, or a person setting
variables. Each leaves its own variables; `from_environment` reads them
into one `Cluster`, the order being what the user set over what an engine
set: JAX's explicit variables (Kubeflow Trainer's `jax-distributed`
runtime and XPK inject them too), GKE's TPU variables, Slurm, Open MPI.
TF_CONFIG (Kubeflow's TFJob) is TensorFlow's own and read there.

What no variable shows, a Cloud TPU VM pod slice (its peers are in the GCE
metadata) or a Kubernetes Job found through the API, JAX's own detection
finds (`jax.distributed.initialize()` without arguments); the JAX backend
asks it where this module finds nothing.

Importable without TensorFlow or JAX: pure functions of the environment.
"""

import dataclasses
import re
from typing import Optional

from pipeline.errors import UserError

# JAX's coordinator port on a TPU slice (jax/_src/clusters/cloud_tpu_cluster.py):
# where only the coordinator's host is named, its port.
TPU_COORDINATOR_PORT = 8482
# Slurm's ports, derived from the job id as JAX derives its coordinator's
# (jax/_src/clusters/slurm_cluster.py): above Linux's ephemeral range
# (32768-60999), so no outgoing connection holds them, and different for
# jobs whose ids differ modulo the range, so two jobs sharing a node do not
# meet. TensorFlow's workers take 8 ports per job from the same range.
SLURM_PORTS = 61440
SLURM_TF_PORTS_PER_JOB = 8


@dataclasses.dataclass(frozen=True)
class Cluster:
  """This process's place among the processes of one run."""
  engine: str  # As users know it: 'Slurm', 'GKE TPU', 'XPK', ...
  num_processes: int
  process_id: int
  # 'host:port' of process 0, where JAX's coordinator listens; None: JAX's
  # own detection finds it (Open MPI's launcher address).
  coordinator: Optional[str] = None
  # Every process's host, by rank, where the engine lists them (Slurm):
  # what TensorFlow's cluster spec is built from.
  hosts: tuple = ()
  local_rank: int = 0  # Among the processes on this host.
  local_size: int = 1
  job: str = ''  # The engine's job id, where it has one.

  def joined_by(self):
    """The engine as a run reports it: 'Slurm (job 7)'."""
    return self.engine + (f' (job {self.job})' if self.job else '')

  def tensorflow_workers(self):
    """'host:port' of every process, by rank, for MultiWorkerMirrored-
    Strategy: a port per process on each host, from the job's range."""
    if not self.hosts:
      raise UserError(f'{self.engine} does not list every process\'s host, '
                      'which TensorFlow\'s workers need: set TF_CONFIG on '
                      'each, or pass --backend=jax')
    if self.local_size > SLURM_TF_PORTS_PER_JOB:
      raise UserError(f'{self.local_size} TensorFlow workers on one host; '
                      f'at most {SLURM_TF_PORTS_PER_JOB} (one per GPU): '
                      'start fewer tasks per node')
    base = SLURM_PORTS + (int(self.job or 0) * SLURM_TF_PORTS_PER_JOB) % 4096
    seen, workers = {}, []
    for host in self.hosts:
      workers.append(f'{host}:{base + seen.get(host, 0)}')
      seen[host] = seen.get(host, 0) + 1
    return workers


def from_environment(environ):
  """The Cluster the variables in `environ` describe; None for a process
  alone (or one JAX's own detection may still place: see the docstring).
  A one-line UserError for variables that contradict each other."""
  for read in (_jax_variables, _gke_tpu, _slurm, _open_mpi):
    cluster = read(environ)
    if cluster:
      if not 0 <= cluster.process_id < cluster.num_processes:
        raise UserError(f'{cluster.engine}: process {cluster.process_id} is '
                        f'not among its {cluster.num_processes} processes')
      return cluster if cluster.num_processes > 1 else None
  return None


def _integer(environ, *names):
  """The first of `names` set in `environ`, as an int; None if none is."""
  for name in names:
    if environ.get(name, '') != '':
      try:
        return int(environ[name])
      except ValueError:
        raise UserError(f'{name}={environ[name]!r} must be an integer') \
            from None
  return None


def _jax_variables(environ):
  """JAX_COORDINATOR_ADDRESS, set by hand, by Kubeflow Trainer (with
  JAX_NUM_PROCESSES, JAX_PROCESS_ID), by XPK (with JAX_COORDINATOR_PORT,
  NNODES, NODE_RANK), or in a Kubernetes indexed Job's manifest (the
  process id from JOB_COMPLETION_INDEX)."""
  address = environ.get('JAX_COORDINATOR_ADDRESS')
  if not address:
    return None
  if ':' not in address.rsplit(']', 1)[-1]:
    port = environ.get('JAX_COORDINATOR_PORT') or TPU_COORDINATOR_PORT
    address = f'{address}:{port}'
  count = _integer(environ, 'JAX_NUM_PROCESSES', 'NNODES')
  rank = _integer(environ, 'JAX_PROCESS_ID', 'NODE_RANK',
                  'JOB_COMPLETION_INDEX')
  if count is None or rank is None:
    raise UserError(f'JAX_COORDINATOR_ADDRESS={address} needs the number of '
                    'processes (JAX_NUM_PROCESSES, or NNODES) and this '
                    "process's rank (JAX_PROCESS_ID, NODE_RANK, or "
                    "an indexed Job's JOB_COMPLETION_INDEX)")
  if 'NNODES' in environ and 'NODE_RANK' in environ:
    engine = 'XPK (NNODES, NODE_RANK)'
  elif 'JAX_PROCESS_ID' not in environ and 'NODE_RANK' not in environ:
    engine = 'a Kubernetes indexed Job (JOB_COMPLETION_INDEX)'
  else:
    engine = 'JAX_COORDINATOR_ADDRESS'
  return Cluster(engine, count, rank, coordinator=address)


def _gke_tpu(environ):
  """A GKE TPU node pool's workers: TPU_PROCESS_ADDRESSES (newer pools) or
  TPU_WORKER_HOSTNAMES, each slice's hosts by worker id, and
  MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID across slices (JAX's rule)."""
  hosts = (environ.get('TPU_PROCESS_ADDRESSES') or
           environ.get('TPU_WORKER_HOSTNAMES') or '')
  if ',' not in hosts or environ.get('TPU_WORKER_ID', '') == '':
    return None
  hosts = [host.strip() for host in hosts.split(',')]
  slices = _integer(environ, 'MEGASCALE_NUM_SLICES') or 1
  rank = (_integer(environ, 'TPU_WORKER_ID') +
          (_integer(environ, 'MEGASCALE_SLICE_ID') or 0) * len(hosts))
  first = (environ.get('MEGASCALE_COORDINATOR_ADDRESS') or hosts[0])
  port = environ.get('JAX_COORDINATOR_PORT') or TPU_COORDINATOR_PORT
  return Cluster('GKE TPU', len(hosts) * slices, rank,
                 coordinator=f'{_host(first)}:{port}')


def _host(address):
  """The host of 'host', 'host:port' or '[v6]:port'."""
  if address.startswith('['):
    return address[:address.index(']') + 1]
  return address.split(':')[0]


def _slurm(environ):
  """A Slurm job step (`srun`): the variables JAX reads, the nodes'
  names, and the tasks on each (Slurm's default block distribution: ranks
  fill the first node, then the next)."""
  names = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS',
           'SLURM_PROCID', 'SLURM_LOCALID')
  if not all(environ.get(name) for name in names):
    return None  # Not a job step: `sbatch`'s own shell has no node list.
  nodes = expand_hostlist(environ['SLURM_STEP_NODELIST'])
  per_node = expand_counts(environ.get('SLURM_STEP_TASKS_PER_NODE', ''))
  count = _integer(environ, 'SLURM_NTASKS')
  hosts = ()
  if len(per_node) == len(nodes) and sum(per_node) == count:
    hosts = tuple(node for node, n in zip(nodes, per_node)
                  for _ in range(n))
  node_id = _integer(environ, 'SLURM_NODEID') or 0
  job = environ['SLURM_JOB_ID']
  port = environ.get('JAX_COORDINATOR_PORT') or (
      SLURM_PORTS + int(job) % 4096)
  return Cluster(
      'Slurm', count, _integer(environ, 'SLURM_PROCID'),
      coordinator=f'{nodes[0]}:{port}', hosts=hosts,
      local_rank=_integer(environ, 'SLURM_LOCALID'),
      local_size=per_node[node_id] if node_id < len(per_node) else 1,
      job=job)


def _open_mpi(environ):
  """`mpirun`'s processes; JAX finds the coordinator from the launcher's
  address itself."""
  if 'OMPI_MCA_orte_hnp_uri' not in environ:
    return None
  return Cluster(
      'Open MPI', _integer(environ, 'OMPI_COMM_WORLD_SIZE') or 1,
      _integer(environ, 'OMPI_COMM_WORLD_RANK') or 0,
      local_rank=_integer(environ, 'OMPI_COMM_WORLD_LOCAL_RANK') or 0,
      local_size=_integer(environ, 'OMPI_COMM_WORLD_LOCAL_SIZE') or 1)


def expand_hostlist(text):
  """Slurm's compressed host list as names: 'gpu[01-03,07],login' ->
  ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login'] (zero padding kept)."""
  names = []
  for prefix, ranges, suffix in re.findall(
      r'([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)', text):
    if not ranges:
      names.append(prefix + suffix)
      continue
    for part in ranges.split(','):
      first, _, last = part.partition('-')
      for number in range(int(first), int(last or first) + 1):
        names.append(f'{prefix}{number:0{len(first)}d}{suffix}')
  return names


def expand_counts(text):
  """Slurm's tasks per node as a list: '2(x3),1' -> [2, 2, 2, 1]."""
  counts = []
  for count, repeat in re.findall(r'(\d+)(?:\(x(\d+)\))?', text):
    counts.extend([int(count)] * int(repeat or 1))
  return counts


def gpu_share(cluster, visible_gpus):
  """Indices of the GPUs this process trains on among the `visible_gpus` its
  host shows it; None where it shows none.

  All where it is alone on its host, or its engine bound it to its own
  (`srun --gpus-per-task=1` shows each task one); otherwise an equal share
  by local rank. JAX's own rule (one GPU per local rank, jax#16788) would
  leave one process per 8-GPU host training on one GPU of eight.
  """
  if not visible_gpus:
    return None
  if cluster is None or cluster.local_size == 1 or visible_gpus == 1:
    return list(range(visible_gpus))
  if visible_gpus % cluster.local_size:
    raise UserError(f'{cluster.local_size} processes on this host cannot '
                    f'share its {visible_gpus} GPUs equally: start one '
                    'process per host, or one per GPU')
  share = visible_gpus // cluster.local_size
  return list(range(cluster.local_rank * share,
                    (cluster.local_rank + 1) * share))
