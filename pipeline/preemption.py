"""SIGTERM (what cloud preemption sends) turned into a save and a stop.

SaveOnPreemption is a periodic action (pipeline/actions.py has the
interface). Not tf.distribute.experimental.PreemptionCheckpointHandler: it
raises NotImplementedError on GCP CPU and TPU VMs (failure_handling.py).
"""

import signal
import threading

from absl import logging
import tensorflow as tf

from pipeline import console
from pipeline import trainer as trainer_lib
from pipeline.errors import Preempted


class SaveOnPreemption:
  """Turns SIGTERM (what cloud preemption sends) into a save and a stop.

  The signal only sets a flag; at the next execution boundary the action
  saves, waits for the checkpoint's commit and raises Preempted. With
  several workers (`strategy` given), the flag is all-reduced (summed) at every
  boundary, so a SIGTERM to any one worker stops all of them at the same
  step, each taking part in the one save (tf.distribute needs every worker
  in it; only the chief's is kept). A second SIGTERM gets the previous
  handler. close() puts that handler back.

  Not tf.distribute.experimental.PreemptionCheckpointHandler: it raises
  NotImplementedError on GCP CPU and TPU VMs (failure_handling.py).
  """

  def __init__(self, checkpointer, workdir, strategy=None):
    self.checkpointer = checkpointer
    self.workdir = workdir
    self.raised = False
    self._previous = None
    self._any_worker = _any_worker(strategy) if strategy else None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    # A flag and nothing else. Python runs this handler inside whatever the
    # main thread was doing, a write to stderr included; a log line from
    # here would fail there as a reentrant write, before the flag is set,
    # and the run would train on through its preemption.
    del frame
    self.raised = True
    signal.signal(signum, self._previous or signal.SIG_DFL)

  def __call__(self, execution):
    stop = self.raised
    if self._any_worker:
      with trainer_lib.peers_lost_in_one_line():
        stop = bool(self._any_worker(tf.constant(float(stop))))
    if not stop:
      return
    logging.warning('%s got SIGTERM: saving a checkpoint at step %d',
                    'This run' if self.raised else 'Another worker',
                    execution.step)
    self.checkpointer.save(execution.step)
    self.checkpointer.wait()
    self.workdir.publish('tensorboard')
    self.workdir.publish(console.LOG_FILE)
    raise Preempted(f'SIGTERM: checkpoint of step {execution.step} committed '
                    f'to {self.workdir.url}; rerun the same command to resume')

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


def _any_worker(strategy):
  """flag -> whether any replica of any worker passed a non-zero flag."""
  if hasattr(strategy, 'any_host'):  # JAX's hosts (devices_jax).
    return strategy.any_host

  @tf.function
  def any_worker(flag):
    flags = strategy.run(lambda: tf.identity(flag))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None) > 0

  return any_worker
