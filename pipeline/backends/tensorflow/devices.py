"""TensorFlow's hardware: the tf.distribute strategy that matches it.

One place decides: a Cloud TPU (TPUStrategy), several machines (TF_CONFIG,
or a Slurm job step -> MultiWorkerMirroredStrategy), several GPUs or logical CPUs
(MirroredStrategy), or one device (the default strategy).

One device gets the default strategy, not OneDeviceStrategy: EfficientNet-B0
trained 2.8x slower under OneDeviceStrategy('/cpu:0') on our CPU (36 vs 100
img/s at 64 px, BUILD_NOTES.md), with the same code otherwise.
"""

import contextlib
import dataclasses
import json
import os
import socket

import tensorflow as tf

from pipeline.backends.tensorflow import tpu_runtime
from pipeline.data import dali
from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.rules import cluster as cluster_lib
from pipeline.rules import hardware as hardware_lib
from pipeline.rules import stopping
from pipeline.rules.hardware import Hardware

_STRATEGY_NAMES = (
    (tf.distribute.MultiWorkerMirroredStrategy, 'MultiWorkerMirroredStrategy'),
    (tf.distribute.TPUStrategy, 'TPUStrategy'),
    (tf.distribute.MirroredStrategy, 'MirroredStrategy'),
)


def tensorflow_version():
  return tf.__version__


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


# What a logical GPU leaves of its share for the CUDA context and cuDNN's
# workspaces, which TensorFlow's memory limit does not count.
SPLIT_GPU_RESERVE = 0.9


def split_gpus(count, memory_mib=None):
  """Splits each visible GPU into `count` logical GPUs with an equal share
  of the smallest GPU's memory (`memory_mib`: nvidia-smi's figures unless
  given); before TensorFlow initialises them."""
  if count < 1:
    raise UserError(f'--split_gpus={count} must be 1 or more')
  if count == 1:
    return
  visible = tf.config.get_visible_devices('GPU')
  if not visible:
    raise UserError(f'--split_gpus={count} splits GPUs; TensorFlow sees '
                    'none here (--num_cpu_devices splits the CPU)')
  memory = hardware_lib.gpu_memory_mib() if memory_mib is None else memory_mib
  if not memory:
    raise UserError(f'--split_gpus={count}: nvidia-smi did not list the '
                    "GPUs' memory, which each logical GPU takes a share of")
  share = int(min(memory) * SPLIT_GPU_RESERVE / count)
  try:
    for gpu in visible:
      tf.config.set_logical_device_configuration(
          gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=share)] *
          count)
  except RuntimeError as e:  # TF already initialised its devices.
    raise UserError(f'cannot split the GPUs after TensorFlow started: {e}')


COLLECTIVES = {
    'auto': tf.distribute.experimental.CommunicationImplementation.AUTO,
    'ring': tf.distribute.experimental.CommunicationImplementation.RING,
    'nccl': tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def resolve(tpu='', tpu_zone=None, gcp_project=None, num_cpu_devices=1,
            collective='auto', collective_timeout_s=None, gpus='',
            tpu_runtime_version='', allow_cpu=False, split_gpus_into=1):
  """Returns the Hardware for this process, in the order TPU, TF_CONFIG or
  Slurm, GPUs, CPU.

  Stops in one line where NVIDIA GPUs are present but TensorFlow sees none,
  unless `allow_cpu`: training on the CPU there is never what was meant.
  """
  found = _find(tpu, tpu_zone, gcp_project, num_cpu_devices, collective,
                collective_timeout_s, gpus, tpu_runtime_version, allow_cpu,
                split_gpus_into)
  return dataclasses.replace(found,
                             strategy_name=strategy_name(found.strategy))


def _find(tpu, tpu_zone, gcp_project, num_cpu_devices, collective,
          collective_timeout_s, gpus, tpu_runtime_version, allow_cpu,
          split_gpus_into):
  cluster = None if os.environ.get('TF_CONFIG') else (
      cluster_lib.from_environment(os.environ))
  if cluster and cluster.engine != 'Slurm':
    raise UserError(f'{cluster.engine} joins hosts on the JAX backend; '
                    'TensorFlow workers join through a Slurm job step or '
                    'TF_CONFIG: pass --backend=jax, or set TF_CONFIG instead')
  if tpu:
    if gpus:
      raise UserError(f'--gpus={gpus} selects GPUs; it cannot be combined '
                      f'with --tpu={tpu}')
    return _tpu(tpu, tpu_zone, gcp_project, tpu_runtime_version)
  if tpu_runtime_version:
    raise UserError(f'--tpu_runtime_version={tpu_runtime_version} needs a TPU '
                    'Node: pass --tpu=NAME or --tpu=grpc://HOST:PORT')
  _limit_visible_gpus(gpus, cluster)
  if grows_gpu_memory(split_gpus_into, os.environ, dali.installed()):
    _grow_gpu_memory()
  split_gpus(split_gpus_into)
  if os.environ.get('TF_CONFIG'):
    return _multi_worker(_tf_config_resolver(), 'TF_CONFIG', collective,
                         collective_timeout_s)
  if cluster:
    return _multi_worker(_slurm_resolver(cluster), cluster.joined_by(),
                         collective, collective_timeout_s)
  split_cpu(num_cpu_devices)
  visible_gpus = tf.config.list_logical_devices('GPU')
  if visible_gpus:
    return _gpus(visible_gpus, split_gpus_into)
  if not allow_cpu:
    _check_no_unusable_gpus()
  cpus = tf.config.list_logical_devices('CPU')
  if len(cpus) > 1:
    strategy = tf.distribute.MirroredStrategy([d.name for d in cpus])
    return Hardware(strategy, 'CPU', detail=f'{len(cpus)} logical CPU devices')
  return Hardware(tf.distribute.get_strategy(), 'CPU', detail='host CPU')


def grows_gpu_memory(split, environ, dali_installed):
  """Whether TensorFlow takes GPU memory as it needs it instead of nearly
  all of every GPU as it starts (its default): where DALI, which decodes on
  the same GPUs, is installed (DALI's DALIDataset docs warn that the
  default "might cause errors in DALI"). Not for logical GPUs (--split_gpus,
  each a fixed share already), nor where the user set
  TF_FORCE_GPU_ALLOW_GROWTH, which TensorFlow reads itself."""
  return (split == 1 and dali_installed
          and 'TF_FORCE_GPU_ALLOW_GROWTH' not in environ)


def _grow_gpu_memory():
  for gpu in tf.config.list_physical_devices('GPU'):
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # TensorFlow started its GPUs already (a test).
      return


def _limit_visible_gpus(spec, cluster):
  """Makes only the GPUs --gpus names visible, and of those this worker's
  share where several share a host; before TF initialises them."""
  physical = tf.config.list_physical_devices('GPU')
  indices = hardware_lib.select_gpus(spec, [d.name for d in physical])
  share = cluster_lib.gpu_share(cluster, len(indices))
  if share is not None:
    indices = [indices[i] for i in share]
  if len(indices) == len(physical):
    return
  try:
    tf.config.set_visible_devices([physical[i] for i in indices], 'GPU')
  except RuntimeError as e:  # TF already initialised its devices.
    raise UserError(f'cannot select --gpus={spec} after TensorFlow started: '
                    f'{e}') from None


def _gpus(gpus, split=1):
  details = tf.config.experimental.get_device_details(
      tf.config.get_visible_devices('GPU')[0])
  capability = details.get('compute_capability')
  name = details.get('device_name', 'GPU')
  if len(gpus) == 1:
    strategy = tf.distribute.get_strategy()
  else:
    strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
  detail = (f'{len(gpus)} x {name}' if split == 1 else
            f'{len(gpus)} logical GPUs, {split} per {name}')
  return Hardware(strategy, 'GPU', gpu_compute_capability=capability,
                  gpu_name=name, detail=detail)


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


# How long workers wait for each other to join, without
# --collective_timeout_s.
JOIN_TIMEOUT_S = 300


def _tf_config_resolver():
  """TF_CONFIG's cluster (Kubeflow's TFJob sets it), checked first."""
  parse_tf_config(os.environ['TF_CONFIG'])
  return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def _slurm_resolver(cluster):
  """A Slurm job step's tasks as TensorFlow workers. TensorFlow's own
  SlurmClusterResolver runs nvidia-smi, and fails on nodes without GPUs
  (tensorflow#56894); the cluster spec needs only Slurm's variables."""
  spec = tf.train.ClusterSpec({'worker': cluster.tensorflow_workers()})
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec, task_type='worker', task_id=cluster.process_id, rpc_layer='grpc')


def _multi_worker(resolver, joined_by, collective, timeout_s):
  # NCCL on GPUs, ring otherwise (auto); the timeout bounds every collective,
  # so a worker that dies or never starts stops the others with an error.
  options = tf.distribute.experimental.CommunicationOptions(
      implementation=COLLECTIVES[collective], timeout_seconds=timeout_s)
  # A worker that never starts would hold the others here for good:
  # TensorFlow's join has no timeout of its own.
  wait_s = timeout_s or JOIN_TIMEOUT_S
  with stopping.within(wait_s, (
      f'error: could not join the other workers through {joined_by} within '
      f'{wait_s:g} s (--collective_timeout_s): every worker must start the '
      'same command')):
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)
  _joined_by.append(joined_by)
  # Its coordination service may take SIGTERM in native code, as
  # jax.distributed's does: SIGTERM and Ctrl-C are the run's own.
  stopping.reclaim()
  spec = resolver.cluster_spec().as_dict()
  task_type, task_index = resolver.task_type, resolver.task_id
  num_workers = len(spec.get('worker', [])) + len(spec.get('chief', []))
  is_chief = (task_type == 'chief' or
              (task_type == 'worker' and task_index == 0 and
               'chief' not in spec))
  gpus = tf.config.list_logical_devices('GPU')
  return Hardware(strategy, 'GPU' if gpus else 'CPU', num_workers=num_workers,
                  task_index=strategy.cluster_resolver.task_id,
                  is_chief=is_chief, cluster=joined_by,
                  detail=f'{task_type} {task_index} of {num_workers} workers')


def _check_reachable(address, timeout_s=10.0):
  """A grpc:// TPU worker must accept a TCP connection; TF would hang."""
  host, _, port = address[len('grpc://'):].rpartition(':')
  try:
    socket.create_connection((host, int(port)), timeout=timeout_s).close()
  except (OSError, ValueError) as e:
    raise UserError(f'TPU {address!r} could not be reached: {e}') from None


def _tpu(tpu, zone, project, runtime_version):
  remote = tpu != 'local'
  if runtime_version:
    if not remote:
      raise UserError(
          f'--tpu_runtime_version={runtime_version} applies to TPU Nodes '
          '(--tpu=NAME or grpc://); a TPU VM runs the software version it '
          'was created with')
    # Before connecting: a version switch restarts the TPU's runtime.
    tpu_runtime.configure(tpu, tpu_runtime.runtime_version(runtime_version),
                          zone=zone, project=project)
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
                  num_workers=topology.num_tasks, tpu_workers_remote=remote,
                  detail=(f'{topology.num_tasks} host(s), '
                          f'{topology.num_tasks * topology.num_tpus_per_task} '
                          'TPU cores'))


def _check_no_unusable_gpus():
  cause = ('this TensorFlow build has no CUDA support'
           if not tf.test.is_built_with_cuda() else
           'its CUDA libraries are missing or do not match the driver (plain '
           '`pip install tensorflow` brings none)')
  hardware_lib.check_no_unusable_gpus(
      f'TensorFlow {tf.__version__}', cause,
      'requirements-gpu.txt (tensorflow[and-cuda])')


def strategy_name(strategy):
  """The strategy as users know it (MultiWorkerMirroredStrategy's class is
  CollectiveAllReduceStrategy inside TensorFlow)."""
  for cls, name in _STRATEGY_NAMES:
    if isinstance(strategy, cls):
      return name
  return 'DefaultStrategy'


def sum_over_workers(strategy):
  """counts -> the element-wise sum of every worker's `counts` (numpy);
  a collective, so every worker calls it at the same step."""

  @tf.function
  def summed(counts):
    per_replica = strategy.run(lambda: tf.identity(counts))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

  def call(counts):
    with peers_lost_in_one_line():
      return summed(tf.constant(counts, tf.float32)).numpy()

  return call


# What a collective raises when another worker died or never answered.
_PEER_LOST = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
              tf.errors.AbortedError, tf.errors.CancelledError)


# The engine that joined this process's workers: set once they joined.
_joined_by = []


@contextlib.contextmanager
def peers_lost_in_one_line():
  """Turns what a collective raises when another worker died or never
  answered into one UserError line (multi-worker runs only)."""
  try:
    yield
  except _PEER_LOST as e:
    if not _joined_by:
      raise
    raise UserError(
        f'another worker ({_joined_by[-1]}) stopped or never answered '
        f'({type(e).__name__}: {first_line(e)}); start every worker again '
        'with the same command (or resubmit the job) to resume from the '
        'last checkpoint') from None
