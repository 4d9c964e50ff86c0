"""A stop request (SIGTERM, Ctrl-C: pipeline/stopping.py) turned into a
checkpoint and a stop at the next execution boundary.

SaveOnStop is a periodic action (pipeline/actions.py has the interface).
Not tf.distribute.experimental.PreemptionCheckpointHandler: it raises
NotImplementedError on GCP CPU and TPU VMs (failure_handling.py).
"""

import signal

from absl import logging
import numpy as np
import tensorflow as tf

from pipeline import console
from pipeline import stopping
from pipeline import trainer as trainer_lib

# The order of the all-reduced request counts.
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SaveOnStop:
  """Saves a checkpoint and stops when this run, or any worker of it, was
  asked to stop.

  At each boundary the action reads the request; with several workers
  (`strategy` given) the requests are all-reduced, so a SIGTERM or Ctrl-C
  to any one worker stops all of them at the same step, each taking part
  in the one save (tf.distribute needs every worker in it; only the
  chief's is kept). It waits for the checkpoint's commit, publishes the
  logs and raises stopping.Stopped with the line to print.
  """

  def __init__(self, checkpointer, workdir, strategy=None):
    self.checkpointer = checkpointer
    self.workdir = workdir
    self._sum_over_workers = _sum_over_workers(strategy) if strategy else None

  def __call__(self, execution):
    own = stopping.requested()
    counts = np.array([float(own == s) for s in _SIGNALS])
    if self._sum_over_workers:
      with trainer_lib.peers_lost_in_one_line():
        counts = self._sum_over_workers(counts)
    if not counts.any():
      return
    signum = own or _SIGNALS[int(np.argmax(counts > 0))]
    name = stopping.NAMES[signum]
    step = execution.step
    if own == signal.SIGINT:
      logging.warning('Ctrl-C: saving a checkpoint at step %d; Ctrl-C again '
                      'to stop now', step)
    else:
      logging.warning('%s got %s: saving a checkpoint at step %d',
                      'This run' if own else 'Another worker', name, step)
    self.checkpointer.save(step)
    self.checkpointer.wait()
    self.workdir.publish('tensorboard')
    self.workdir.publish(console.LOG_FILE)
    kind = 'preempted' if signum == signal.SIGTERM else 'stopped'
    raise stopping.Stopped(
        signum, f'{kind}: {name}: checkpoint of step {step} committed to '
        f'{self.workdir.url}; rerun the same command to resume')


def _sum_over_workers(strategy):
  """counts -> the element-wise sum of every replica's `counts` (numpy):
  non-zero where any worker was asked to stop that way."""
  if hasattr(strategy, 'sum_over_hosts'):  # JAX's hosts (devices_jax).
    return strategy.sum_over_hosts

  @tf.function
  def sum_over_workers(counts):
    per_replica = strategy.run(lambda: tf.identity(counts))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

  return lambda counts: sum_over_workers(
      tf.constant(counts, tf.float32)).numpy()
