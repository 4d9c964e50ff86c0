"""Checkpoints of model, optimizer (loss scale included) and step.

Local workdir: tf.train.CheckpointManager is the commit protocol. Each
checkpoint's files are written under temporary names and renamed into place,
and only then is the `checkpoint` state file, the commit marker, rewritten
(atomically) to name it. A crash mid-save leaves the marker on the previous
complete checkpoint.

gs:// workdir: the same local save into the staging directory, then a
background thread uploads the files to `checkpoints/ckpt-N/` (each verified
by CRC32C) and writes `checkpoints/ckpt-N/COMMITTED` last, listing the files
and their checksums. Only a committed checkpoint is ever restored; others
are deleted at the next start. Training waits only for the local save.
"""

import json
import os
import queue
import shutil
import tempfile
import threading
import time

import tensorflow as tf
from absl import logging

from pipeline.errors import UserError

_MARKER = 'COMMITTED'


class UploadError(UserError):
  """Checkpoint upload failed after retries; the staged copy is kept."""


class Checkpointer:
  """Saves and restores one run's state in `<workdir>/checkpoints`."""

  def __init__(self, workdir, max_to_keep, is_chief, io_device=None,
               **trackables):
    self.checkpoint = tf.train.Checkpoint(**trackables)
    # A TPU Node's variables live on remote hosts, which would otherwise
    # read and write the files there; '/job:localhost' keeps them here.
    self.options = tf.train.CheckpointOptions(experimental_io_device=io_device)
    self.workdir = workdir
    self.is_chief = is_chief
    self.remote = workdir.remote if is_chief else None  # Where saves upload.
    self.max_to_keep = max_to_keep
    if is_chief:
      directory = workdir.path('checkpoints')
    else:
      # tf.distribute needs every worker in a save; only the chief's is kept.
      directory = tempfile.mkdtemp(prefix='checkpoints-worker-')
    self.directory = directory
    # Remote runs keep two local copies: enough to stage the next save while
    # the previous one uploads from its own hard-linked snapshot.
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, directory,
        max_to_keep=2 if self.remote else max_to_keep)
    self.blocked_s = 0.0
    self._uploads = queue.Queue(maxsize=1)
    self._error = None
    self._thread = None
    if self.remote:
      self._thread = threading.Thread(target=self._upload_loop, daemon=True)
      self._thread.start()

  # --- restore ---

  def restore_latest(self):
    """Restores the newest committed checkpoint; returns its step or None.

    Every worker restores the chief's checkpoint (all must resume at the same
    step); only the chief finishes staged uploads and cleans the bucket.
    """
    if self.workdir.remote:
      path = self._fetch_latest_remote()
    else:
      path = tf.train.latest_checkpoint(self.workdir.path('checkpoints'))
    if not path:
      return None
    self.checkpoint.restore(path, options=self.options
                            ).assert_existing_objects_matched()
    logging.info('Restored %s', path)
    return int(path.rsplit('-', 1)[1])

  def _staged_dir(self, step):
    return os.path.join(self.directory, 'uploading', f'ckpt-{step}')

  def _fetch_latest_remote(self):
    """Finishes pending uploads, cleans uncommitted ones, downloads the newest."""
    remote = self.workdir.remote
    committed = self._remote_steps(remote)
    if not self.is_chief:
      return self._download(remote, max(committed)) if committed else None
    staged_root = os.path.join(self.directory, 'uploading')
    for name in sorted(os.listdir(staged_root)) if os.path.isdir(
        staged_root) else []:
      step = int(name.split('-')[1])
      if step > max(committed, default=-1):
        logging.info('Finishing the upload of staged checkpoint %d', step)
        self._upload(step)
        committed.append(step)
      else:
        shutil.rmtree(os.path.join(staged_root, name))
    self._delete_uncommitted(committed)
    return self._download(remote, max(committed)) if committed else None

  def _download(self, remote, step):
    manifest = remote.read_json(f'checkpoints/ckpt-{step}/{_MARKER}')
    target = os.path.join(self.directory, 'restored', f'ckpt-{step}')
    os.makedirs(target, exist_ok=True)
    for name in manifest['files']:
      remote.download(f'checkpoints/ckpt-{step}/{name}',
                      os.path.join(target, name))
    logging.info('Downloaded committed checkpoint %d from %s', step,
                 remote.url)
    return os.path.join(target, f'ckpt-{step}')

  def _remote_steps(self, remote=None):
    return sorted(int(name.split('/')[1].split('-')[1])
                  for name in (remote or self.remote).list('checkpoints/')
                  if name.endswith('/' + _MARKER))

  def _delete_uncommitted(self, committed):
    for name in self.remote.list('checkpoints/'):
      folder = name.split('/')[1]
      if int(folder.split('-')[1]) not in committed:
        logging.info('Deleting uncommitted %s/%s', self.remote.url, name)
        self.remote.delete(name)

  # --- save ---

  def save(self, step):
    """Saves locally, then (gs://) queues the upload. Returns blocked seconds."""
    self.raise_if_failed()
    start = time.perf_counter()
    path = self.manager.save(checkpoint_number=step, options=self.options)
    if self.remote:
      staged = self._staged_dir(step)
      os.makedirs(staged, exist_ok=True)
      for name in tf.io.gfile.listdir(self.directory):
        if name.startswith(f'ckpt-{step}.'):
          os.link(os.path.join(self.directory, name),
                  os.path.join(staged, name))
      self._uploads.put(step)  # Waits only if an upload is already queued.
    blocked = time.perf_counter() - start
    self.blocked_s += blocked
    logging.info('Saved checkpoint %s (training blocked %.2f s)', path, blocked)
    return blocked

  def _upload_loop(self):
    while True:
      step = self._uploads.get()
      try:
        if step is not None and self._error is None:
          self._upload(step)
      except Exception as e:  # Reported to the training loop, not lost.
        self._error = e
      finally:
        self._uploads.task_done()
      if step is None:
        return

  def _upload(self, step):
    staged = self._staged_dir(step)
    names = sorted(os.listdir(staged))
    checksums = {}
    for name in names:
      checksums[name] = self.remote.upload(
          os.path.join(staged, name), f'checkpoints/ckpt-{step}/{name}')
    # The marker goes last: a checkpoint without it is never restored.
    self.remote.write_text(f'checkpoints/ckpt-{step}/{_MARKER}',
                           json.dumps({'step': step, 'files': checksums}))
    shutil.rmtree(staged)
    logging.info('Committed checkpoint %d to %s', step, self.remote.url)
    self._prune()

  def _prune(self):
    steps = self._remote_steps()
    for old in steps[:-self.max_to_keep]:
      self.remote.delete(f'checkpoints/ckpt-{old}/{_MARKER}')
      for name in self.remote.list(f'checkpoints/ckpt-{old}/'):
        self.remote.delete(name)

  def raise_if_failed(self):
    if self._error is not None:
      error, self._error = self._error, None
      raise UploadError(
          f'checkpoint upload to {self.remote.url} failed: {error}; the '
          f'checkpoint is kept in {self.directory}/uploading; rerun the same '
          'command to upload it and resume once GCS is reachable')

  def wait(self):
    """Blocks until queued uploads are committed; raises if one failed."""
    if self.remote:
      start = time.perf_counter()
      self._uploads.join()
      self.blocked_s += time.perf_counter() - start
    self.raise_if_failed()


