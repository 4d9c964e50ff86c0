"""Where this process's work lands on its host: the GPUs it takes of those
its host shows it, as the plan names them, and whether the address its
host's name resolves to lets the other hosts reach it. Pure functions of a
cluster.Cluster and the environment.
"""

from pipeline.errors import UserError


def gpu_share(cluster, visible_gpus, gpus_from='the driver'):
  """Indices of the GPUs this process trains on among the `visible_gpus` its
  host shows it (`gpus_from` says what listed them); None where it shows
  none.

  All where it is alone on its host, or its engine bound it to its own
  (`srun --gpus-per-task=N` shows each task its N); otherwise an equal
  share by local rank. JAX's own rule (one GPU per local rank, jax#16788)
  would leave one process per 8-GPU host training on one GPU of eight.
  """
  if not visible_gpus:
    return None
  if (cluster is None or cluster.local_size == 1 or cluster.gpus_bound or
      visible_gpus == 1):
    return list(range(visible_gpus))
  if visible_gpus % cluster.local_size:
    raise UserError(
        f'{cluster.local_size} processes on this host '
        f'({cluster.local_size_from or cluster.engine}) cannot share its '
        f'{visible_gpus} GPUs ({gpus_from}) equally: give each its own '
        '(srun --gpus-per-task=N), or start one process per host or one '
        'per GPU')
  share = visible_gpus // cluster.local_size
  return list(range(cluster.local_rank * share,
                    (cluster.local_rank + 1) * share))


def share_line(cluster, share, environ):
  """The GPUs `share` (gpu_share's indices) names, as the plan prints
  them: 'GPUs 2,3 (its share of 4, 2 processes on this host;
  CUDA_VISIBLE_DEVICES=0,1,2,3)'; '' without any."""
  if share is None:
    return ''
  visible = environ.get('CUDA_VISIBLE_DEVICES')
  entries = [e.strip() for e in visible.split(',')] if visible else []
  names = [entries[i] if entries else str(i) for i in share]
  shown = (f'CUDA_VISIBLE_DEVICES={visible}' if visible is not None else
           'nvidia-smi -L')
  if cluster and cluster.gpus_bound:
    why = f'bound to this task by {cluster.engine}'
  elif cluster and cluster.local_size > 1 and len(share) < max(
      len(entries), 1):
    why = (f'its share of {len(entries)}, {cluster.local_size} processes on '
           'this host')
  else:
    why = 'all this host shows it'
  return f'GPUs {",".join(names)} ({why}; {shown})'


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
