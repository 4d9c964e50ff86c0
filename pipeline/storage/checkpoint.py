"""Checkpoints of model, optimizer (loss scale included) and step.

Two layers. Locally, tf.train.CheckpointManager is the commit protocol: each
checkpoint's files are written under temporary names and renamed into place,
and only then is the `checkpoint` state file, the commit marker, rewritten
(atomically) to name it, so a crash mid-save leaves the marker on the
previous complete checkpoint. For a gs:// workdir the same local save goes
to the staging directory and checkpoint_gcs.CommittedSeries commits it to
the bucket in the background; only committed checkpoints are restored.
"""

import glob
import os
import tempfile
import time

import tensorflow as tf
from absl import logging

from pipeline.storage import checkpoint_files
from pipeline.storage import checkpoint_gcs
from pipeline.storage.checkpoint_gcs import UploadError  # pylint: disable=unused-import
from pipeline.storage.checkpoint_gcs import step_of
from pipeline.errors import UserError
from pipeline.errors import first_line

# What restoring a truncated, missing or corrupt checkpoint file raises
# (OSError: h5py's, for a Keras checkpoint file).
_DAMAGED = (tf.errors.OpError, ValueError, IndexError, AssertionError,
            OSError, KeyError)


class Checkpointer:
  """Saves and restores one run's state in `<workdir>/<series>`.

  `series` names the folder, so a second series (a kept best checkpoint)
  can live beside the rolling one under its own retention.
  """

  def __init__(self, workdir, max_to_keep, is_chief, files,
               series='checkpoints', if_missing=None):
    # `files(directory, keep)`: the local layer (checkpoint_files' classes,
    # as the trainer gives them) in `directory`, keeping `keep`.
    # Trackables a checkpoint may lack (one saved before they existed: a
    # moving average turned on at a resume), and what to do then.
    self.if_missing = if_missing or {}
    # Where the run's checkpoints live: the chief's folder (local), or GCS.
    self.shared_dir = workdir.path(series)
    self.gcs = None
    if is_chief:
      self.directory = self.shared_dir
    else:
      # tf.distribute needs every worker in a save, and a reader of a gs://
      # workdir fetches checkpoints somewhere: a folder of this process's
      # own, removed when the Checkpointer goes or the process exits (each
      # holds whole checkpoints; left behind, they fill the disk).
      self._scratch = tempfile.TemporaryDirectory(
          prefix=f'{series}-worker-', ignore_cleanup_errors=True)
      self.directory = self._scratch.name
    if workdir.remote:
      self.gcs = checkpoint_gcs.CommittedSeries(
          workdir.remote, series, self.directory, max_to_keep,
          uploads=is_chief)
    # A gs:// run keeps two local copies: enough to stage the next save
    # while the previous one uploads from its own hard-linked snapshot.
    local_keep = 2 if self.gcs else max_to_keep
    self.files = files(self.directory, local_keep)
    self.is_chief = is_chief
    self.blocked_s = 0.0

  def restore_latest(self):
    """Restores the newest committed checkpoint that restores; its step or None.

    A damaged one (a truncated or missing file: what a full disk, a partial
    copy or a bad sync leaves) is reported and the next older one tried;
    if none restores, a one-line UserError names them. Every worker tries
    the chief's checkpoints in the same order, so all resume at one step.
    """
    damaged = []
    for path in self._newest_first():
      try:
        self._restore(path)
      except _DAMAGED as e:
        logging.warning('Checkpoint %s is damaged and cannot be restored '
                        '(%s); trying the next older one', path,
                        first_line(e))
        damaged.append(path)
        continue
      if damaged:
        self._set_aside(damaged)
      return step_of(path)
    if damaged:
      raise UserError(
          f'no checkpoint of {self.url} restores: {", ".join(damaged)} '
          f'{"is" if len(damaged) == 1 else "are"} damaged; restore them '
          'from a copy, or move the folder aside to start from step 0')
    return None

  def restore_step(self, step):
    """Restores the committed checkpoint of `step`, or a one-line UserError."""
    available = self.committed_steps()
    if step not in available:
      raise UserError(f'{self.url} has no committed checkpoint of step {step}'
                      f'; committed: {", ".join(map(str, available)) or "none"}')
    path = (self.gcs.fetch(step) if self.gcs else
            os.path.join(self.shared_dir, f'ckpt-{step}'))
    try:
      self._restore(path)
    except _DAMAGED as e:
      raise UserError(f'checkpoint {path} is damaged and cannot be restored: '
                      f'{first_line(e)}') from None
    return step

  def committed_steps(self):
    """Steps of the committed checkpoints, oldest first."""
    if self.gcs:
      return self.gcs.committed_steps()
    return sorted(step_of(p) for p in self._local_paths())

  @property
  def url(self):
    return self.gcs.url if self.gcs else self.shared_dir

  def _newest_first(self):
    """Local paths of the committed checkpoints, newest first."""
    if self.gcs:
      yield from self.gcs.fetch_newest_first()
      return
    yield from reversed(self._local_paths())

  def _local_paths(self):
    """The committed checkpoints in the shared folder, oldest first (a
    worker that is not the chief reads the chief's folder)."""
    return self.files.paths(self.shared_dir)

  def _set_aside(self, damaged):
    """Takes damaged checkpoints out of the series, keeping their files.

    Left in place, they would be tried first at every start, count towards
    the checkpoints kept, and a later save of the same step would overwrite
    them. Locally their files move to `damaged/`; on GCS a DAMAGED marker
    replaces COMMITTED (checkpoint_gcs). Only the chief changes the workdir.
    """
    if not self.is_chief:
      return
    if self.gcs:
      for path in damaged:
        self.gcs.set_aside(step_of(path))
      return
    folder = os.path.join(self.shared_dir, 'damaged')
    os.makedirs(folder, exist_ok=True)
    for path in damaged:
      for name in tf.io.gfile.glob(f'{glob.escape(path)}.*'):
        os.replace(name, os.path.join(folder, os.path.basename(name)))
      logging.warning('Moved the damaged checkpoint %s to %s', path, folder)

  def restore_last_saved(self):
    """Restores this process's newest save (every worker saved that step).

    Falls back to restore_latest() when this process has not saved yet.
    Queued commits finish first, so the GCS series is settled.
    """
    self.wait()
    path = self.files.latest()
    if not path:
      return self.restore_latest()
    self._restore(path)
    return step_of(path)

  def _restore(self, path):
    """Restores every object from `path`; raises one of _DAMAGED if not."""
    missing = self.files.restore(path, optional=list(self.if_missing))
    logging.info('Restored %s', path)
    for name in missing:
      self.if_missing[name](path)

  def save(self, step):
    """Saves locally, then (gs://) queues the commit. Returns blocked seconds."""
    start = time.perf_counter()
    if self.gcs:
      self.gcs.raise_if_failed()
    path = self.files.save(step)
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
