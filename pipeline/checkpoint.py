"""Checkpoints of model, optimizer (loss scale included) and step.

Two layers. Locally, tf.train.CheckpointManager is the commit protocol: each
checkpoint's files are written under temporary names and renamed into place,
and only then is the `checkpoint` state file, the commit marker, rewritten
(atomically) to name it, so a crash mid-save leaves the marker on the
previous complete checkpoint. For a gs:// workdir the same local save goes
to the staging directory and checkpoint_gcs.CommittedSeries commits it to
the bucket in the background; only committed checkpoints are restored.
"""

import tempfile
import time

import tensorflow as tf
from absl import logging

from pipeline import checkpoint_gcs
from pipeline.checkpoint_gcs import UploadError  # pylint: disable=unused-import
from pipeline.checkpoint_gcs import step_of


class Checkpointer:
  """Saves and restores one run's state in `<workdir>/<series>`.

  `series` names the folder, so a second series (a kept best checkpoint)
  can live beside the rolling one under its own retention.
  """

  def __init__(self, workdir, max_to_keep, is_chief, io_device=None,
               series='checkpoints', **trackables):
    self.checkpoint = tf.train.Checkpoint(**trackables)
    # A TPU Node's variables live on remote hosts, which would otherwise
    # read and write the files there; '/job:localhost' keeps them here.
    self.options = tf.train.CheckpointOptions(experimental_io_device=io_device)
    # Where the run's checkpoints live: the chief's folder (local), or GCS.
    self.shared_dir = workdir.path(series)
    self.gcs = None
    if is_chief:
      self.directory = self.shared_dir
    else:
      # tf.distribute needs every worker in a save; only the chief's is kept.
      self.directory = tempfile.mkdtemp(prefix=f'{series}-worker-')
    if workdir.remote:
      self.gcs = checkpoint_gcs.CommittedSeries(
          workdir.remote, series, self.directory, max_to_keep,
          uploads=is_chief)
    # A gs:// run keeps two local copies: enough to stage the next save
    # while the previous one uploads from its own hard-linked snapshot.
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, self.directory,
        max_to_keep=2 if self.gcs else max_to_keep)
    self.blocked_s = 0.0

  def restore_latest(self):
    """Restores the newest committed checkpoint; returns its step or None.

    Every worker restores the chief's checkpoint: all must resume at the
    same step.
    """
    if self.gcs:
      path = self.gcs.fetch_latest()
    else:
      path = tf.train.latest_checkpoint(self.shared_dir)
    if not path:
      return None
    self.checkpoint.restore(path, options=self.options
                            ).assert_existing_objects_matched()
    logging.info('Restored %s', path)
    return step_of(path)

  def save(self, step):
    """Saves locally, then (gs://) queues the commit. Returns blocked seconds."""
    start = time.perf_counter()
    if self.gcs:
      self.gcs.raise_if_failed()
    path = self.manager.save(checkpoint_number=step, options=self.options)
    if self.gcs:
      self.gcs.submit(step)
    blocked = time.perf_counter() - start
    self.blocked_s += blocked
    logging.info('Saved checkpoint %s (training blocked %.2f s)', path, blocked)
    return blocked

  def wait(self):
    """Blocks until queued commits are done; raises if one failed."""
    if self.gcs:
      start = time.perf_counter()
      self.gcs.wait()
      self.blocked_s += time.perf_counter() - start
