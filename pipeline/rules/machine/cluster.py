"""Which engine started this process beside others, and how they join.

A run past one host is the same command started on every host by
something: Slurm's `srun`, Open MPI's `mpirun`, Kubernetes (an indexed Job,
a JobSet, Kubeflow Trainer, XPK), GKE's TPU node pools, or a person setting
variables. Each leaves its own variables; `from_environment` reads them
into one `Cluster`, the order being what the user set over what an engine
set: JAX's explicit variables (Kubeflow Trainer's `jax-distributed`
runtime and XPK inject them too), GKE's TPU variables, Open MPI, Slurm
(Open MPI before Slurm, as JAX: `mpirun` inside an allocation passes the
job's Slurm variables to its ranks). TF_CONFIG (Kubeflow's TFJob) is
TensorFlow's own and read there.

Where JAX knows the engine (Slurm, Open MPI, GKE's TPU hosts) the Cluster
names JAX's own detection (`jax_detects`) and JAX reads the engine's
variables itself; the rest of the Cluster names the engine, gives each
process its GPUs and gives TensorFlow its workers. Where no variable shows
the peers (a Cloud TPU VM pod slice: the GCE metadata; a Kubernetes Job:
its API) JAX's detection alone finds them.

Importable without TensorFlow or JAX: pure functions of the environment.
"""

import dataclasses
from typing import ClassVar, Optional

from pipeline.errors import UserError
from pipeline.rules.machine import slurm_variables

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
  # 'host:port' of process 0, where JAX's coordinator listens, where JAX
  # does not find it itself (jax_detects).
  coordinator: Optional[str] = None
  local_rank: int = 0  # Among the processes on this host.
  local_size: int = 1
  job: str = ''  # The engine's job id, where it has one.
  # JAX's cluster_detection_method for this engine, where JAX reads its
  # variables itself; None: the fields above are passed to it.
  jax_detects: Optional[str] = None
  # What the engine gave this process's task, where it says
  # (placement.bind checks what the process is shown against it): GPUs per
  # task (`srun --gpus-per-task`), the node's GPUs for its tasks, and how
  # it bound them ('per_task:2', 'none', 'closest'; '' unsaid).
  gpus_per_task: Optional[int] = None
  gpus_on_node: Optional[int] = None
  gpu_bind: str = ''
  # What says how many processes share this host, for a message.
  local_size_from: str = ''
  host: str = ''  # The node this process runs on, where the engine says.
  # Whether the engine names every process's host (all_hosts), as
  # TensorFlow's workers need: Slurm does; mpirun, Kubernetes, XPK do not.
  lists_hosts: ClassVar[bool] = False

  def joined_by(self):
    """The engine as a run reports it: 'Slurm (job 7)'."""
    return self.engine + (f' (job {self.job})' if self.job else '')

  def cores_fix(self, processes, share):
    """How to start each of `processes` a host with `share` cores: the
    fix where a process is held to fewer (placement.starved_cpus)."""
    del processes, share
    return 'start it with the CPU affinity of its share (taskset, numactl)'

  def jax_cannot_join(self, installed):
    """One line where JAX cannot read this engine's variables with the
    modules `installed(name)` finds; None where it can."""
    del installed
    return None

  def missing_peers_cause(self):
    """Why fewer processes joined than the engine started, as JAX joins
    under it (joined_problem)."""
    return ': every host must start the same command with the same variables'

  def all_hosts(self):
    """Every process's host, by rank, where the engine lists them."""
    raise UserError(f'{self.engine} does not list every process\'s host, '
                    'which TensorFlow\'s workers need: set TF_CONFIG on '
                    'each, or pass --backend=jax')

  def tensorflow_workers(self):
    """'host:port' of every process, by rank, for MultiWorkerMirrored-
    Strategy: a port per process on each host, from the job's range. The
    host this process is given must be the one it runs on."""
    hosts = self.all_hosts()
    if self.local_size > SLURM_TF_PORTS_PER_JOB:
      raise UserError(f'{self.local_size} TensorFlow workers on one host; '
                      f'at most {SLURM_TF_PORTS_PER_JOB} (one per GPU): '
                      'start fewer tasks per node')
    if self.host and hosts[self.process_id] != self.host:
      raise UserError(
          f'{self.engine} placed process {self.process_id} on {self.host}, '
          f'where its layout puts it on {hosts[self.process_id]}: '
          "TensorFlow's workers need srun -m block or -m cyclic, or "
          'TF_CONFIG on each')
    base = SLURM_PORTS + (int(self.job or 0) * SLURM_TF_PORTS_PER_JOB) % 4096
    seen, workers = {}, []
    for host in hosts:
      workers.append(f'{host}:{base + seen.get(host, 0)}')
      seen[host] = seen.get(host, 0) + 1
    return workers


def from_environment(environ):
  """The Cluster the variables in `environ` describe, a lone process's too
  (one task of a Slurm step: it joins nobody); None where no engine's
  variables are set (JAX's own detection may still place the process: see
  the docstring). A one-line UserError for variables that contradict each
  other."""
  for read in (_jax_variables, _gke_tpu, _open_mpi, _slurm):
    cluster = read(environ)
    if cluster:
      if not 0 <= cluster.process_id < cluster.num_processes:
        raise UserError(f'{cluster.engine}: process {cluster.process_id} is '
                        f'not among its {cluster.num_processes} processes')
      return cluster
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
  # JAX reads JAX_NUM_PROCESSES and JAX_PROCESS_ID; what Kubeflow Trainer
  # (JAX_PROCESS_COUNT, PROCESSES_IN_JOB, JOB_INDEX) and XPK (NNODES,
  # NODE_RANK) set, CPU workloads included, it does not: all are passed.
  count = _integer(environ, 'JAX_NUM_PROCESSES', 'JAX_PROCESS_COUNT',
                   'NNODES', 'PROCESSES_IN_JOB')
  rank = _integer(environ, 'JAX_PROCESS_ID', 'NODE_RANK',
                  'JOB_COMPLETION_INDEX', 'JOB_INDEX')
  if count is None or rank is None:
    raise UserError(f'JAX_COORDINATOR_ADDRESS={address} needs the number of '
                    'processes (JAX_NUM_PROCESSES, JAX_PROCESS_COUNT, NNODES '
                    "or PROCESSES_IN_JOB) and this process's rank "
                    '(JAX_PROCESS_ID, NODE_RANK, or an indexed Job\'s '
                    'JOB_COMPLETION_INDEX or JOB_INDEX)')
  if 'NNODES' in environ and 'NODE_RANK' in environ:
    engine = 'XPK (NNODES, NODE_RANK)'
  elif 'JAX_PROCESS_ID' not in environ and 'NODE_RANK' not in environ:
    index = next(name for name in ('JOB_COMPLETION_INDEX', 'JOB_INDEX')
                 if environ.get(name, '') != '')
    engine = f'a Kubernetes Job ({index})'
  else:
    engine = 'JAX_COORDINATOR_ADDRESS'
  return Cluster(engine, count, rank, coordinator=address)


def _gke_tpu(environ):
  """A GKE TPU node pool's workers: TPU_PROCESS_ADDRESSES (newer pools) or
  TPU_WORKER_HOSTNAMES, each slice's hosts by worker id, and
  MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID across slices. JAX reads
  them itself (its coordinator is the first host's, port 8482)."""
  hosts = (environ.get('TPU_PROCESS_ADDRESSES') or
           environ.get('TPU_WORKER_HOSTNAMES') or '')
  if ',' not in hosts or environ.get('TPU_WORKER_ID', '') == '':
    return None
  count = len(hosts.split(','))
  slices = _integer(environ, 'MEGASCALE_NUM_SLICES') or 1
  rank = (_integer(environ, 'TPU_WORKER_ID') +
          (_integer(environ, 'MEGASCALE_SLICE_ID') or 0) * count)
  return Cluster('GKE TPU', count * slices, rank, jax_detects='gketpu')


def _slurm(environ):
  """A Slurm job step (`srun`): JAX reads its variables itself; the tasks
  on each node and the layout that placed them, for the GPU share and
  TensorFlow's workers."""
  names = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS',
           'SLURM_PROCID', 'SLURM_LOCALID')
  if not all(environ.get(name) for name in names):
    return None  # Not a job step: `sbatch`'s own shell has no node list.
  per_node = slurm_variables.expand_counts(
      environ.get('SLURM_STEP_TASKS_PER_NODE', ''))
  node_id = _integer(environ, 'SLURM_NODEID') or 0
  return SlurmCluster(
      'Slurm', _integer(environ, 'SLURM_NTASKS'),
      _integer(environ, 'SLURM_PROCID'),
      local_rank=_integer(environ, 'SLURM_LOCALID'),
      local_size=per_node[node_id] if node_id < len(per_node) else 1,
      job=environ['SLURM_JOB_ID'], jax_detects='slurm',
      **slurm_variables.gpus(environ),
      local_size_from='SLURM_STEP_TASKS_PER_NODE',
      host=environ.get('SLURMD_NODENAME', ''),
      node_list=environ['SLURM_STEP_NODELIST'], tasks_per_node=tuple(per_node),
      layout=slurm_variables.layout(environ))


@dataclasses.dataclass(frozen=True)
class SlurmCluster(Cluster):
  """A Slurm step's Cluster: its hosts, by rank, from its node list
  (hostnames) and its layout."""
  node_list: str = ''
  tasks_per_node: tuple = ()
  layout: str = 'block'
  lists_hosts: ClassVar[bool] = True

  def cores_fix(self, processes, share):
    del processes
    return f'give each task its cores (srun --cpus-per-task={share})'

  def all_hosts(self):
    nodes = slurm_variables.hostnames(self.node_list)
    counts = list(self.tasks_per_node)
    if len(counts) != len(nodes) or sum(counts) != self.num_processes:
      raise UserError(f'Slurm lists {len(nodes)} nodes and tasks '
                      f'{counts} for {self.num_processes} tasks: set TF_CONFIG '
                      'on each, or pass --backend=jax')
    if self.layout == 'block':
      return tuple(node for node, n in zip(nodes, counts) for _ in range(n))
    if self.layout != 'cyclic':
      raise UserError(f'Slurm placed the tasks by {self.layout}, which '
                      "TensorFlow's workers cannot follow: srun -m block or "
                      '-m cyclic, TF_CONFIG on each task, or --backend=jax')
    placed = []
    while len(placed) < self.num_processes:  # One a node, round and round.
      for index, node in enumerate(nodes):
        if counts[index]:
          placed.append(node)
          counts[index] -= 1
    return tuple(placed)


def _open_mpi(environ):
  """`mpirun`'s processes: Open MPI 4 (its launcher's ORTE URI, which JAX's
  'ompi' detection reads) or 5 (PRRTE: the COMM_WORLD variables without
  it; JAX's 'mpi4py' detection asks MPI itself, where 'ompi' needs the
  URI on jax 0.10)."""
  version = ('4' if 'OMPI_MCA_orte_hnp_uri' in environ else
             '5' if all(environ.get(f'OMPI_COMM_WORLD_{name}')
                        for name in ('SIZE', 'RANK', 'LOCAL_RANK')) else None)
  if not version:
    return None
  return OpenMpiCluster(
      f'Open MPI {version}', _integer(environ, 'OMPI_COMM_WORLD_SIZE') or 1,
      _integer(environ, 'OMPI_COMM_WORLD_RANK') or 0,
      local_rank=_integer(environ, 'OMPI_COMM_WORLD_LOCAL_RANK') or 0,
      local_size=_integer(environ, 'OMPI_COMM_WORLD_LOCAL_SIZE') or 1,
      jax_detects='ompi' if version == '4' else 'mpi4py',
      local_size_from='OMPI_COMM_WORLD_LOCAL_SIZE')


@dataclasses.dataclass(frozen=True)
class OpenMpiCluster(Cluster):
  """`mpirun`'s processes: it binds each to cores by default, and under
  Open MPI 5 JAX asks MPI itself, through mpi4py."""

  def cores_fix(self, processes, share):
    return ('start mpirun with --bind-to none, or give each process its '
            f'cores (--map-by ppr:{processes}:node:PE={share})')

  def jax_cannot_join(self, installed):
    if self.jax_detects != 'mpi4py' or installed('mpi4py'):
      return None
    return ('Open MPI 5 starts no launcher JAX can read without mpi4py, '
            'which asks MPI itself: pip install -r requirements-jax.txt (or '
            'requirements-gpu.txt; both have mpi4py), or set '
            'JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID')

  def missing_peers_cause(self):
    if self.jax_detects != 'mpi4py':
      return super().missing_peers_cause()
    return (': mpi4py asked an MPI library other than the mpirun that '
            'started them, and each process started alone; run the mpirun '
            'of the MPI mpi4py was built with (python -m mpi4py --mpi-lib-'
            'version names it)')


def joined_problem(found, joined):
  """One line where the framework joined `joined` processes, not the
  `found` engine's count; None where they agree. Under mpirun this is
  mpi4py loading another MPI than the mpirun that started the process:
  every rank then starts alone, as process 0 of 1."""
  if not found or found.num_processes == joined:
    return None
  return (f'{found.engine} started {found.num_processes} processes, but '
          f'{joined} joined the run{found.missing_peers_cause()}')
