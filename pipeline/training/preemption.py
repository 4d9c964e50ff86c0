"""A stop request (SIGTERM, Ctrl-C: rules/machine/stopping.py) turned into a
checkpoint and a stop at the next execution boundary.

SaveOnStop is a periodic action (pipeline/training/actions.py has the interface).
Not tf.distribute.experimental.PreemptionCheckpointHandler: it raises
NotImplementedError on GCP CPU and TPU VMs (failure_handling.py).
"""

import signal

from absl import logging
import numpy as np

from pipeline.run import console
from pipeline.rules.machine import stopping

# The order of the all-reduced request counts.
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SaveOnStop:
  """Saves a checkpoint and stops when this run, or any worker of it, was
  asked to stop.

  At each boundary the action reads the request; with several workers
  (`sum_over_workers` given: the backend's) the requests are all-reduced, so a SIGTERM or Ctrl-C
  to any one worker stops all of them at the same step, each taking part
  in the one save (tf.distribute needs every worker in it; only the
  chief's is kept). It waits for the checkpoint's commit, publishes the
  logs and raises stopping.Stopped with the line to print.
  """

  def __init__(self, checkpointer, workdir, sum_over_workers=None):
    self.checkpointer = checkpointer
    self.workdir = workdir
    self._sum_over_workers = sum_over_workers

  def __call__(self, execution):
    own = stopping.requested()
    counts = np.array([float(own == s) for s in _SIGNALS])
    if self._sum_over_workers:
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

