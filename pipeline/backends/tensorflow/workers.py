"""Several TensorFlow workers as one MultiWorkerMirroredStrategy: their
cluster from TF_CONFIG (Kubeflow's TFJob sets it) or a Slurm job step, the
join bounded in time, the sum over workers, and a lost peer in one line.
"""

import contextlib
import json
import os

import tensorflow as tf

from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.rules.machine import stopping
from pipeline.rules.machine.hardware import Hardware

COLLECTIVES = {
    'auto': tf.distribute.experimental.CommunicationImplementation.AUTO,
    'ring': tf.distribute.experimental.CommunicationImplementation.RING,
    'nccl': tf.distribute.experimental.CommunicationImplementation.NCCL,
}


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


def tf_config_resolver():
  """TF_CONFIG's cluster (Kubeflow's TFJob sets it), checked first."""
  parse_tf_config(os.environ['TF_CONFIG'])
  return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def slurm_resolver(cluster):
  """A Slurm job step's tasks as TensorFlow workers. TensorFlow's own
  SlurmClusterResolver runs nvidia-smi, and fails on nodes without GPUs
  (tensorflow#56894); the cluster spec needs only Slurm's variables."""
  spec = tf.train.ClusterSpec({'worker': cluster.tensorflow_workers()})
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      spec, task_type='worker', task_id=cluster.process_id, rpc_layer='grpc')


def join(resolver, joined_by, collective, timeout_s):
  """This worker's Hardware under a MultiWorkerMirroredStrategy over
  `resolver`'s cluster, joined by `joined_by` (what the run reports)."""
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
    try:
      strategy = tf.distribute.MultiWorkerMirroredStrategy(
          cluster_resolver=resolver, communication_options=options)
    except tf.errors.UnknownError as e:
      if 'Could not start gRPC server' not in str(e):
        raise
      address = resolver.cluster_spec().task_address(resolver.task_type,
                                                     resolver.task_id)
      raise UserError(
          f'this worker could not listen on {address}, its address in '
          f'{joined_by} (the port is taken: a stale run, or another worker '
          'on this network stack); end what holds it, or give the workers '
          'other ports') from None
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
