"""Find the hardware and build the tf.distribute strategy that matches it.

One place decides: a Cloud TPU (TPUStrategy), several machines (TF_CONFIG ->
MultiWorkerMirroredStrategy), several GPUs or logical CPUs
(MirroredStrategy), or one device (the default strategy).

One device gets the default strategy, not OneDeviceStrategy: EfficientNet-B0
trained 2.8x slower under OneDeviceStrategy('/cpu:0') on our CPU (36 vs 100
img/s at 64 px, BUILD_NOTES.md), with the same code otherwise.
"""

import dataclasses
import json
import os
import socket
from typing import Optional

import tensorflow as tf

from pipeline.errors import UserError


@dataclasses.dataclass(frozen=True)
class Hardware:
  """The resolved devices and the strategy that spans them."""
  strategy: tf.distribute.Strategy
  device_kind: str  # 'TPU', 'GPU' or 'CPU'
  num_workers: int = 1
  task_index: int = 0
  is_chief: bool = True
  gpu_compute_capability: Optional[tuple] = None
  detail: str = ''

  @property
  def strategy_name(self):
    name = type(self.strategy).__name__
    return 'DefaultStrategy' if name == '_DefaultDistributionStrategy' else name

  @property
  def num_replicas(self):
    return self.strategy.num_replicas_in_sync


def split_cpu(num_cpu_devices):
  """Splits the host CPU into logical devices; must run before TF starts."""
  if num_cpu_devices < 1:
    raise UserError(f'--num_cpu_devices={num_cpu_devices} must be 1 or more')
  if num_cpu_devices == 1:
    return
  cpu = tf.config.list_physical_devices('CPU')[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
  except RuntimeError as e:  # TF already initialised its devices.
    raise UserError(f'cannot split the CPU after TensorFlow started: {e}')


COLLECTIVES = {
    'auto': tf.distribute.experimental.CommunicationImplementation.AUTO,
    'ring': tf.distribute.experimental.CommunicationImplementation.RING,
    'nccl': tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def resolve(tpu='', tpu_zone=None, gcp_project=None, num_cpu_devices=1,
            collective='auto', collective_timeout_s=None):
  """Returns the Hardware for this process, in the order TPU, TF_CONFIG, GPUs, CPU."""
  if tpu:
    return _tpu(tpu, tpu_zone, gcp_project)
  if os.environ.get('TF_CONFIG'):
    return _multi_worker(collective, collective_timeout_s)
  split_cpu(num_cpu_devices)
  gpus = tf.config.list_logical_devices('GPU')
  if gpus:
    return _gpus(gpus)
  cpus = tf.config.list_logical_devices('CPU')
  if len(cpus) > 1:
    strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
    return Hardware(strategy, 'CPU', detail=f'{len(cpus)} logical CPU devices')
  return Hardware(tf.distribute.get_strategy(), 'CPU', detail='host CPU')


def _gpus(gpus):
  details = tf.config.experimental.get_device_details(
      tf.config.list_physical_devices('GPU')[0])
  capability = details.get('compute_capability')
  name = details.get('device_name', 'GPU')
  if len(gpus) == 1:
    strategy = tf.distribute.get_strategy()
  else:
    strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
  return Hardware(strategy, 'GPU', gpu_compute_capability=capability,
                  detail=f'{len(gpus)} x {name}')


def parse_tf_config(text):
  """Returns (cluster, task type, task index) of a TF_CONFIG, or a UserError."""
  try:
    tf_config = json.loads(text)
    cluster, task = tf_config['cluster'], tf_config['task']
    task_type, task_index = task['type'], int(task['index'])
    members = cluster[task_type]
    members[task_index]  # pylint: disable=pointless-statement
  except (ValueError, KeyError, TypeError, IndexError) as e:
    raise UserError(f'TF_CONFIG is malformed or names a task not in its '
                    f'cluster ({type(e).__name__}: {e}): {text!r}')
  return cluster, task_type, task_index


def _multi_worker(collective, timeout_s):
  cluster, task_type, task_index = parse_tf_config(os.environ['TF_CONFIG'])
  # NCCL on GPUs, ring otherwise (auto); the timeout bounds every collective,
  # so a worker that dies or never starts stops the others with an error.
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=COLLECTIVES[collective], timeout_seconds=timeout_s)
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=options)
  resolver = strategy.cluster_resolver
  num_workers = len(cluster.get('worker', [])) + len(cluster.get('chief', []))
  is_chief = (task_type == 'chief' or
              (task_type == 'worker' and task_index == 0 and
               'chief' not in cluster))
  gpus = tf.config.list_logical_devices('GPU')
  return Hardware(strategy, 'GPU' if gpus else 'CPU', num_workers=num_workers,
                  task_index=resolver.task_id, is_chief=is_chief,
                  detail=f'{task_type} {task_index} of {num_workers} workers')


def _check_reachable(address, timeout_s=10.0):
  """A grpc:// TPU worker must accept a TCP connection; TF would hang."""
  host, _, port = address[len('grpc://'):].rpartition(':')
  try:
    socket.create_connection((host, int(port)), timeout=timeout_s).close()
  except (OSError, ValueError) as e:
    raise UserError(f'TPU {address!r} could not be reached: {e}') from None


def _tpu(tpu, zone, project):
  if tpu.startswith('grpc://'):
    _check_reachable(tpu)
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu, zone=zone, project=project)
    tf.config.experimental_connect_to_cluster(resolver)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  except Exception as e:  # The resolver raises many types; all mean "no TPU".
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f'TPU {tpu!r} could not be reached: {message}')
  strategy = tf.distribute.TPUStrategy(resolver)
  return Hardware(strategy, 'TPU',
                  num_workers=topology.num_tasks,
                  detail=(f'{topology.num_tasks} host(s), '
                          f'{topology.num_tasks * topology.num_tpus_per_task} '
                          'TPU cores'))
