"""Checkpoints of model, optimizer (loss scale included) and step.

tf.train.CheckpointManager is the commit protocol: each checkpoint's files are
written under temporary names and renamed into place, and only then is the
`checkpoint` state file, the commit marker, rewritten (atomically) to name it.
A crash mid-save leaves the marker on the previous complete checkpoint, which
is what a rerun restores; the half-written files are overwritten later.
"""

import os
import tempfile

import tensorflow as tf
from absl import logging


class Checkpointer:
  """Saves and restores one run's state in `<workdir>/checkpoints`."""

  def __init__(self, workdir, max_to_keep, is_chief, **trackables):
    self.checkpoint = tf.train.Checkpoint(**trackables)
    if is_chief:
      directory = os.path.join(workdir, 'checkpoints')
    else:
      # tf.distribute needs every worker in a save; only the chief's is kept.
      directory = tempfile.mkdtemp(prefix='checkpoints-worker-')
    self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                              max_to_keep=max_to_keep)

  def restore_latest(self):
    """Restores the newest committed checkpoint; returns its path or None."""
    path = self.manager.latest_checkpoint
    if path:
      self.checkpoint.restore(path).assert_existing_objects_matched()
      logging.info('Restored %s', path)
    return path

  def save(self, step):
    path = self.manager.save(checkpoint_number=step)
    logging.info('Saved checkpoint %s', path)
    return path
