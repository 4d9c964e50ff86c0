"""The hardware of a run on Keras' JAX backend: every device, data parallel.

One process per host, or per GPU. On several hosts `jax.distributed`
joins them first, through the engine that started them (Slurm, a TPU pod
slice, Kubernetes: pipeline/rules/machine/cluster.py). The model is
replicated on every device of every host and each global batch is split along its first
axis over them (Keras calls this DataParallel); each host's tf.data
pipeline reads its own shard of the records and feeds its own devices.
"""

import contextlib
import os
import re
import socket

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import tensorflow as tf

from pipeline import backends
from pipeline.backends.jax.mesh import DataParallel
from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.rules.machine import cluster as cluster_lib
from pipeline.rules.machine import placement
from pipeline.rules.machine import hardware as hardware_lib
from pipeline.rules.machine import stopping

_KINDS = {'tpu': 'TPU', 'gpu': 'GPU', 'cuda': 'GPU', 'rocm': 'GPU',
          'cpu': 'CPU'}


def host_batches(input_fn):
  """This host's batches (as numpy) from `input_fn(InputContext)`: one
  pipeline per host, each batch the host's share of the global batch."""
  hosts = jax.process_count()
  return HostBatches(input_fn(tf.distribute.InputContext(
      num_input_pipelines=hosts, input_pipeline_id=jax.process_index(),
      num_replicas_in_sync=hosts)))


def sum_over_hosts(values):
  """The element-wise sum of every host's `values` (numpy); every host
  calls it at the same step (a SIGTERM to one host stops all at one
  step)."""
  with peers_lost_in_one_line():
    gathered = multihost_utils.process_allgather(np.asarray(values))
  return np.asarray(gathered).reshape(-1, len(values)).sum(axis=0)


class HostBatches:
  """A tf.data dataset iterated as numpy, a fresh pass per iter()."""

  def __init__(self, dataset):
    self.dataset = dataset

  def __iter__(self):
    return self.dataset.as_numpy_iterator()


def _keep_tensorflow_off_the_gpus():
  """tf.data and the export run on TensorFlow, whose CUDA build (from
  requirements-gpu.txt) would take most of every GPU's memory as it starts;
  the GPUs are JAX's."""
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # TensorFlow started already (a test's process).
    logging.warning('TensorFlow started before the JAX backend: it may hold '
                    'GPU memory')


# What DALI needs of a GPU it decodes on beside JAX: its batches decoded
# ahead (at most 2 GiB, data/dali/) and nvJPEG's buffers.
DALI_GPU_BYTES = 4 << 30
MEMORY_FRACTION = 'XLA_PYTHON_CLIENT_MEM_FRACTION'


def leave_room_for_dali(input_pipeline, environ=os.environ):
  """Sets the share of each GPU JAX takes as it starts (75% by default) so
  DALI, which may decode in this process, keeps DALI_GPU_BYTES of the
  smallest GPU: 95% of an 80 GiB card, 75% of a 16 GiB one, never under
  half. Not where tf.data feeds, nor where the user set the share."""
  if MEMORY_FRACTION in environ or not input_pipeline_lib.may_decode_here(input_pipeline):
    return
  memory_mib = hardware_lib.gpu_memory_mib()
  if memory_mib:
    fraction = max(0.5, 1 - DALI_GPU_BYTES / (min(memory_mib) << 20))
    environ[MEMORY_FRACTION] = f'{fraction:.2f}'


def _join_hosts(found, gpus):
  """Joins this process to the other hosts of its run, where there are any,
  before any device is used (pipeline/rules/machine/cluster.py says who started
  them); the Cluster, or None for a process alone.

  Where JAX knows the engine (Slurm, Open MPI, GKE's TPU hosts) it reads
  the engine's variables itself, told only this process's GPUs; where the
  variables are ones JAX does not read (Kubeflow's, XPK's) they are passed;
  where none are set, JAX's own detection looks (a TPU VM slice's metadata,
  Kubernetes' API). A lone task of a Slurm step starts no coordinator: two
  in one allocation would bind the same port. `found`: the engine's
  Cluster (cluster.from_environment); `gpus`: this process's share."""
  if jax.distributed.is_initialized():  # By its caller: a Ray actor.
    return cluster_lib.Cluster('the caller (jax.distributed initialised)',
                               jax.process_count(), jax.process_index())
  if found and found.num_processes == 1:
    return None
  if not gpus and not backends.tpu_attached():  # CPUs: gloo's collectives.
    problem = placement.unreachable_host_name(
        found, socket.gethostname(), socket.gethostbyname)
    if problem:
      raise UserError(problem)
  timeout_s = int(os.environ.get('JAX_INITIALIZATION_TIMEOUT_S', '300'))
  engine = found.engine if found else "JAX's cluster detection"
  failed = (f'could not join the other hosts through {engine} within '
            f'{timeout_s} s (JAX_INITIALIZATION_TIMEOUT_S): every host must '
            'start the same command')
  cannot = found and found.jax_cannot_join(backends.installed)
  if cannot:
    raise UserError(cannot)
  if found and found.jax_detects:
    where = {'cluster_detection_method': found.jax_detects}
  elif found:
    where = {'coordinator_address': found.coordinator,
             'num_processes': found.num_processes,
             'process_id': found.process_id,
             'cluster_detection_method': 'deactivate'}
  else:
    where = {}
  # JAX's client aborts the process (a native fatal error and a stack dump)
  # when its own timeout passes; this one passes first, in one line.
  try:
    with stopping.within(timeout_s, f'error: {failed}'):
      jax.distributed.initialize(
          local_device_ids=gpus,
          initialization_timeout=timeout_s + _JAX_TIMEOUT_MARGIN_S, **where)
  except Exception as e:  # pylint: disable=broad-except
    # JAX found no cluster either, or was in use before (a notebook, a
    # test's process): a process alone.
    if found is None and ('coordinator_address should be' in str(e) or
                          'must be called before' in str(e)):
      return None
    raise UserError(f'{failed} ({type(e).__name__}: {first_line(e)})') \
        from None
  if found or jax.process_count() == 1:  # One TPU VM: no others to join.
    return found
  return cluster_lib.Cluster(engine + ' (a Cloud TPU pod slice, or Kubernetes)',
                             jax.process_count(), jax.process_index())


# What a collective or JAX's coordination service raises when another host
# died: gloo's broken connections on CPUs, the service's codes elsewhere.
_PEER_LOST = re.compile(r'Gloo|Connection reset|UNAVAILABLE|DEADLINE_EXCEEDED'
                        r'|ABORTED|heartbeat|coordination service', re.I)
# The engine that joined this process's hosts: set once they joined.
_joined_by = []


@contextlib.contextmanager
def peers_lost_in_one_line():
  """Turns what JAX raises when another host died or never answered into
  one UserError line (multi-host runs only). A collective whose peer
  died may raise a ValueError rather than a JaxRuntimeError (gloo's
  "AllGather failed: ... Connection reset by peer" from a jitted gather)."""
  try:
    yield
  except (jax.errors.JaxRuntimeError, ValueError) as e:
    if not _joined_by or not _PEER_LOST.search(str(e)):
      raise
    raise UserError(
        f'another host ({_joined_by[-1]}) stopped or never answered '
        f'({first_line(e)}); start every host again with the same command '
        '(or resubmit the job) to resume from the last checkpoint') from None


# JAX's own join timeout is this much later than the run's.
_JAX_TIMEOUT_MARGIN_S = 30


def unsupported_settings(request, environ=os.environ):
  """One line for the first hardware flag or environment setting of
  `request` (a rules.config.request.Request) that only TensorFlow honours,
  naming what JAX takes instead; None if there is none."""
  defaults = type(request)()
  if environ.get('TF_CONFIG'):
    return ('TF_CONFIG joins TensorFlow workers; on the JAX backend hosts '
            'join through JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and '
            'JAX_PROCESS_ID (a TPU pod slice finds its hosts itself): unset '
            'TF_CONFIG, or pass --backend=tensorflow')
  if request.collective != defaults.collective:
    return (f'--collective={request.collective} picks TensorFlow\'s '
            'all-reduce; on the JAX backend XLA chooses the collectives: '
            'leave it out, or pass --backend=tensorflow')
  if request.collective_timeout_s != defaults.collective_timeout_s:
    return ('--collective_timeout_s bounds TensorFlow\'s collectives; on the '
            'JAX backend JAX_INITIALIZATION_TIMEOUT_S bounds joining the '
            'hosts: leave it out, or pass --backend=tensorflow')
  if request.split_gpus != defaults.split_gpus:
    return (f'--split_gpus={request.split_gpus} makes logical GPUs for '
            "TensorFlow's MirroredStrategy; JAX runs one replica per GPU: "
            'leave it out, or pass --backend=tensorflow')
  for name in ('tpu_runtime_version', 'tpu_zone', 'gcp_project'):
    if getattr(request, name):
      return (f'--{name}={getattr(request, name)} applies to TPU Nodes, which '
              'TensorFlow drives; on the JAX backend a TPU VM (--tpu=local) '
              'runs the software installed on it: leave it out, or pass '
              '--backend=tensorflow')
  return None


def _select_gpus(spec, found):
  """The devices --gpus names, among this host's GPUs (a UserError listing
  them, 'none' without any)."""
  gpus = [d for d in found if _KINDS.get(d.platform) == 'GPU']
  indices = hardware_lib.select_gpus(
      spec, [f'GPU:{i}' for i in range(len(gpus))])
  if jax.process_count() > 1:
    raise UserError(f'--gpus={spec} selects GPUs of one host; on several '
                    'JAX hosts set CUDA_VISIBLE_DEVICES on each instead')
  return [gpus[i] for i in indices]


def resolve(request):
  """The Hardware of this process on JAX: all its devices, all hosts' (or
  the GPUs request.gpus names). A UserError, before any device is used,
  for a setting only TensorFlow honours."""
  tpu, num_cpu_devices = request.tpu, request.num_cpu_devices
  problem = unsupported_settings(request)
  if problem:
    raise UserError(problem)
  if num_cpu_devices < 1:
    raise UserError(f'--num_cpu_devices={num_cpu_devices} must be 1 or more')
  if num_cpu_devices > 1:
    jax.config.update('jax_num_cpu_devices', num_cpu_devices)
  _keep_tensorflow_off_the_gpus()
  leave_room_for_dali(request.input_pipeline)
  engine = cluster_lib.from_environment(os.environ)
  # Every GPU it is shown: the launcher left it only its own
  # (placement.bind). Passed on, or JAX would keep one per local rank.
  gpus = list(range(hardware_lib.visible_gpu_count())) or None
  cluster = _join_hosts(engine, gpus)
  if cluster:
    _joined_by.append(cluster.joined_by())
  problem = cluster_lib.joined_problem(engine, jax.process_count())
  if problem:
    raise UserError(problem)
  # jax.distributed's preemption notifier has just taken SIGTERM in native
  # code: SIGTERM and Ctrl-C are the run's own (rules/machine/stopping.py).
  stopping.reclaim()
  found = jax.devices()
  if request.gpus:
    found = _select_gpus(request.gpus, found)
  kind = _KINDS.get(found[0].platform, found[0].platform.upper())
  if tpu and kind != 'TPU':
    raise UserError(f'--tpu={tpu}: JAX finds no TPU on this host (its '
                    f'devices: {len(found)} x {found[0].platform}); run on '
                    'a TPU VM or a Colab TPU runtime, or leave --tpu out')
  if kind == 'CPU' and not request.allow_cpu:
    cause = ('its CUDA plugin found no usable GPU (the driver, or CUDA '
             'libraries that do not match it)'
             if any(backends.installed(f'jax-cuda{cuda}-plugin')
                    for cuda in (12, 13)) else
             'no CUDA plugin is installed (this jaxlib runs on CPUs and TPUs)')
    hardware_lib.check_no_unusable_gpus(
        f'JAX {jax.__version__}', cause,
        'requirements-gpu.txt (jax[cuda12])')
  hosts = jax.process_count()
  name = found[0].device_kind if kind != 'CPU' else 'CPU device'
  detail = (f'{len(found)} x {name}' if kind != 'CPU' or len(found) > 1
            else 'host CPU')
  if hosts > 1:
    detail += f' over {hosts} hosts'
  return hardware_lib.Hardware(
      DataParallel(found), kind, num_workers=hosts,
      task_index=jax.process_index(), is_chief=jax.process_index() == 0,
      detail=detail, strategy_name='DataParallel',
      cluster=cluster.joined_by() if cluster else '',
      gpu_share=(placement.chosen().line(os.environ) if placement.chosen()
                 else ''),
      **(gpu_fields(found[0]) if kind == 'GPU' else {}))


def gpu_fields(device):
  """The model and compute capability of a GPU as JAX reports them (CUDA
  devices carry `compute_capability`, e.g. '7.5' on a T4): what the
  precision rule and a saved measurement are keyed by."""
  capability = getattr(device, 'compute_capability', None)
  return {'gpu_name': device.device_kind,
          'gpu_compute_capability': (
              tuple(int(part) for part in str(capability).split('.'))
              if capability else None)}
