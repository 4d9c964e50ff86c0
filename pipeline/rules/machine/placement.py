"""Where this process's work lands on its host: the GPUs it takes of those
its host shows it, checked against what its engine gave its task, and
whether the address its host's name resolves to lets the other hosts
reach it. Pure functions of a cluster.Cluster and the environment; the
launchers apply the GPUs before TensorFlow or JAX load (bind)."""

import dataclasses

from pipeline.errors import UserError
from pipeline.rules.machine import cluster as cluster_lib

VISIBLE = 'CUDA_VISIBLE_DEVICES'


@dataclasses.dataclass(frozen=True)
class Binding:
  """The GPUs this process trains on: `entries` of what it was shown (as
  CUDA_VISIBLE_DEVICES names them), and why."""
  entries: tuple
  why: str
  shown: str  # What showed the process its GPUs: 'CUDA_VISIBLE_DEVICES=...'.

  def line(self, environ):
    """As the plan prints it, with what `environ` shows the process now:
    'GPUs 2,3 (its share ...; CUDA_VISIBLE_DEVICES=2,3 of
    CUDA_VISIBLE_DEVICES=0,1,2,3)'."""
    now = environ.get(VISIBLE)
    now = f'{VISIBLE}={now}' if now is not None else self.shown
    return (f'GPUs {",".join(self.entries)} ({self.why}; {now}'
            + ('' if self.shown == now else f' of {self.shown}') + ')')


def bind(cluster, environ, driver_gpus):
  """This process's Binding, or None where it is shown no GPU.

  Shown: CUDA_VISIBLE_DEVICES' entries where it is set, else the
  `driver_gpus` nvidia-smi lists (every GPU of the host; 0 unknown).
  Kept: all where the process is alone on its host; under Slurm, what its
  task was given (--gpus-per-task, or the node's GPUs, SLURM_GPUS_ON_NODE,
  over its tasks), all of them where Slurm bound them to the task, its
  own by local rank where the node's tasks are shown them all
  (--gpu-bind=none, or a binding that does not isolate); under other
  engines all it is shown where CUDA_VISIBLE_DEVICES gave it its own
  (_given_its_own), else an equal share by local rank. A count
  that fits neither is a one-line UserError naming it. JAX's own rule
  (one GPU per local rank, jax#16788) would leave one process per 8-GPU
  host training on one GPU of eight.
  """
  visible = environ.get(VISIBLE)
  entries = (tuple(e.strip() for e in visible.split(',') if e.strip())
             if visible is not None else tuple(map(str, range(driver_gpus))))
  if not entries:
    return None
  shown = (f'{VISIBLE}={visible}' if visible is not None else
           f'nvidia-smi -L: {len(entries)}')
  if cluster is None or (cluster.local_size == 1 and
                         not cluster.gpus_per_task):
    return _checked_alone(cluster, entries, shown)
  asked, source = _asked(cluster)
  if asked is None and _given_its_own(cluster, entries, visible,
                                      driver_gpus):
    return Binding(entries, f'its own, by {VISIBLE} per process under '
                   f'{cluster.engine} ({len(entries)} for each of the '
                   f"host's {cluster.local_size} processes)", shown)
  if asked is None:  # An engine that gives no GPUs: an equal share.
    if len(entries) % cluster.local_size:
      raise UserError(
          f'{cluster.local_size} processes on this host '
          f'({cluster.local_size_from or cluster.engine}) cannot share its '
          f'{len(entries)} GPUs ({shown}) equally: give each its own '
          '(CUDA_VISIBLE_DEVICES per process), or start one process per '
          'host or one per GPU')
    return _share(cluster, entries, len(entries) // cluster.local_size,
                  shown, f'{cluster.engine} binds no GPUs')
  if len(entries) == asked:
    return Binding(entries, f'bound to this task by {cluster.engine}: '
                   f'{source}', shown)
  if len(entries) == asked * cluster.local_size:
    return _share(cluster, entries, asked, shown,
                  f'{source}; {cluster.engine} bound none ({cluster.gpu_bind})'
                  if cluster.gpu_bind else
                  f'{source}; {cluster.engine} bound none')
  raise UserError(
      f'{cluster.engine} gave this task {asked} GPU(s) ({source}), but it is '
      f'shown {len(entries)} ({shown}): neither its own {asked} nor the '
      f'{asked * cluster.local_size} of the {cluster.local_size} tasks on '
      'this node; ask for whole GPUs per task (srun --gpus-per-task=N) or '
      'per node, with a --gpu-bind that isolates them or none')


def _given_its_own(cluster, entries, visible, driver_gpus):
  """Whether a process under an engine that gives no GPUs (mpirun) was
  given its own by CUDA_VISIBLE_DEVICES per process, as Horovod's and
  sites' wrappers set it (CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK):
  set, and too few to share equally among the host's processes, or with
  its host's other processes as many again no more than the driver lists
  (nvidia-smi counts every GPU of the host, whatever is visible)."""
  if visible is None:
    return False
  return bool(len(entries) % cluster.local_size or (
      driver_gpus and len(entries) < driver_gpus and
      len(entries) * cluster.local_size <= driver_gpus))


def _checked_alone(cluster, entries, shown):
  """A process alone on its host keeps what it is shown; under Slurm, what
  its node has for it, where Slurm says."""
  on_node = cluster and cluster.gpus_on_node
  if on_node and len(entries) != on_node:
    raise UserError(
        f'{cluster.engine} gave this node {on_node} GPU(s) '
        f'(SLURM_GPUS_ON_NODE) for its one task, which is shown '
        f'{len(entries)} ({shown}); set CUDA_VISIBLE_DEVICES to its own, or '
        'ask Slurm for the GPUs it is shown')
  return Binding(entries, 'all this host shows it', shown)


def _asked(cluster):
  """(GPUs the task was given, what says so); (None, '') where the engine
  gives none."""
  if cluster.gpus_per_task:
    return cluster.gpus_per_task, f'--gpus-per-task={cluster.gpus_per_task}'
  if cluster.gpus_on_node:
    on_node, tasks = cluster.gpus_on_node, cluster.local_size
    if on_node % tasks:
      raise UserError(
          f'{cluster.engine} gave this node {on_node} GPUs '
          f'(SLURM_GPUS_ON_NODE) for {tasks} tasks '
          f'({cluster.local_size_from}), which cannot share them equally: '
          'ask for --gpus-per-task=N, or as many tasks as GPUs divide into')
    return on_node // tasks, (f"{on_node // tasks} of the node's {on_node} "
                              f'(SLURM_GPUS_ON_NODE) for each of its {tasks} '
                              'tasks')
  return None, ''


def _share(cluster, entries, each, shown, reason):
  rank = cluster.local_rank
  return Binding(entries[rank * each:(rank + 1) * each],
                 f'its share of {len(entries)}, by local rank {rank} of '
                 f'{cluster.local_size}: {reason}', shown)


def starved_cpus(cluster, usable, host_cores):
  """One line where this process may run on fewer of its host's cores
  (`usable`, its CPU affinity) than its share of `host_cores` over the
  processes on the host, with the fix for its engine; None otherwise.
  mpirun binds each process to one core by default where it starts two or
  fewer (a socket above), which leaves tf.data one core, silently."""
  processes = cluster.local_size if cluster else 1
  share = max(host_cores // processes, 1)
  if usable >= share:
    return None
  alone = cluster_lib.Cluster('', 1, 0)  # Started by hand: no engine.
  fix = (cluster or alone).cores_fix(processes, share)
  return (f'this process may run on {usable} of its host\'s {host_cores} '
          f'cores (its CPU affinity), fewer than its share of {share} for '
          f'{processes} process(es) a host: the input pipeline gets too few '
          f'and the accelerators wait; {fix}')


_bound = []


def keep(binding):
  """Remembers the process's Binding (the launchers' environment.prepare
  made it); the plan prints it."""
  _bound[:] = [binding]


def chosen():
  """The Binding `keep` kept, or None (a process that chose none)."""
  return _bound[0] if _bound else None


_cpu_line = []


def keep_cpus(line):
  """Remembers starved_cpus' line for this process (the launchers'
  environment.prepare found it); the plan warns with it."""
  _cpu_line[:] = [line] if line else []


def cpus_line():
  return _cpu_line[0] if _cpu_line else None


def unreachable_host_name(cluster, hostname, resolve):
  """One line where this host's own name resolves to a loopback address
  while the run's processes span several hosts (`resolve(name)` gives an
  address); None otherwise. JAX's CPU collectives (gloo) listen on the
  address the host's name resolves to: on 127.0.1.1 (Debian's /etc/hosts
  maps a host's own name there) the other hosts never connect, and the run
  ends only after a timeout, in a traceback."""
  if not _spans_hosts(cluster, resolve):
    return None
  try:
    address = resolve(hostname)
  except OSError as e:
    return (f"this host's name {hostname!r} does not resolve ({e}): JAX's "
            'CPU collectives listen on its address; add it to /etc/hosts '
            'with an address the other hosts reach')
  if not _loopback(address):
    return None
  return (f"this host's name {hostname!r} resolves to {address}, a loopback "
          "address: JAX's CPU collectives (gloo) would listen there and the "
          f'other hosts of {cluster.joined_by()} could not connect; map '
          f'{hostname!r} to an address they reach in /etc/hosts (Debian maps '
          "a host's own name to 127.0.1.1)")


def _loopback(address):
  return address.startswith('127.') or address == '::1'


def _spans_hosts(cluster, resolve):
  """Whether the processes are on more than this host: as the engine
  counts them per host (Slurm, Open MPI), else where the coordinator's
  address is no loopback one."""
  if cluster is None:
    return False
  if cluster.local_size_from:
    return cluster.local_size < cluster.num_processes
  if not cluster.coordinator:
    return False
  host = cluster.coordinator.rsplit(':', 1)[0].strip('[]')
  try:
    return not _loopback(resolve(host))
  except OSError:
    return False
