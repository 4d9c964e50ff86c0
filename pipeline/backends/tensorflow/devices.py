"""TensorFlow's hardware: the tf.distribute strategy that matches it.

One place decides: a Cloud TPU (TPUStrategy), several machines (TF_CONFIG,
or a Slurm job step -> MultiWorkerMirroredStrategy: workers.py), several
GPUs or logical CPUs (MirroredStrategy), or one device (the default
strategy).

One device gets the default strategy, not OneDeviceStrategy: EfficientNet-B0
trained 2.8x slower under OneDeviceStrategy('/cpu:0') on our CPU (36 vs 100
img/s at 64 px, BUILD_NOTES.md), with the same code otherwise.
"""

import dataclasses
import os
import socket

import tensorflow as tf

from pipeline.backends.tensorflow import tpu_runtime
from pipeline.backends.tensorflow import workers
from pipeline.data import dali
from pipeline.errors import UserError
from pipeline.rules.machine import cluster as cluster_lib
from pipeline.rules.machine import placement
from pipeline.rules.machine import hardware as hardware_lib
from pipeline.rules.machine.hardware import Hardware

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
                             strategy_name=strategy_name(found.strategy),
                             gpu_share=_share_line(gpus))


def _share_line(spec):
  """The plan's words for this process's GPUs, as the launcher bound them
  (placement.bind; not where --gpus picks them)."""
  binding = placement.chosen()
  return binding.line(os.environ) if binding and not spec else ''


def _find(tpu, tpu_zone, gcp_project, num_cpu_devices, collective,
          collective_timeout_s, gpus, tpu_runtime_version, allow_cpu,
          split_gpus_into):
  cluster = None if os.environ.get('TF_CONFIG') else (
      cluster_lib.from_environment(os.environ))
  joins = cluster and cluster.num_processes > 1  # A lone task joins nobody.
  if joins and not cluster.lists_hosts:
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
  _limit_visible_gpus(gpus)
  if grows_gpu_memory(split_gpus_into, os.environ, dali.installed()):
    _grow_gpu_memory()
  split_gpus(split_gpus_into)
  if os.environ.get('TF_CONFIG'):
    return workers.join(workers.tf_config_resolver(), 'TF_CONFIG',
                        collective, collective_timeout_s)
  if joins:
    return workers.join(workers.slurm_resolver(cluster), cluster.joined_by(),
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


def _limit_visible_gpus(spec):
  """Makes only the GPUs --gpus names visible, before TF initialises them
  (the launcher left this process only its own: placement.bind)."""
  physical = tf.config.list_physical_devices('GPU')
  indices = hardware_lib.select_gpus(spec, [d.name for d in physical])
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
