"""The GCS commit protocol for checkpoints saved locally first.

A checkpoint of step N counts on GCS only once every file is uploaded (each
verified by CRC32C) to `<series>/ckpt-N/` and `<series>/ckpt-N/COMMITTED`
is written last, listing the files and their checksums. Uploads run on a
one-thread executor from a hard-linked snapshot (`<local>/uploading/ckpt-N`),
so training waits only for the local save, and the local manager deleting
old files never touches a file being uploaded. Restore takes the newest
committed checkpoint; at start the chief first finishes staged uploads newer
than it and deletes folders that have no marker.
"""

import concurrent.futures
import json
import os
import re
import shutil
import threading

from absl import logging
from google.api_core import exceptions
from google.resumable_media.common import DataCorruption

from pipeline.errors import UserError
from pipeline.errors import first_line

MARKER = 'COMMITTED'
# Replaces MARKER on a committed checkpoint found damaged; its objects stay.
DAMAGED = 'DAMAGED'


class UploadError(UserError):
  """Checkpoint upload failed after retries; the staged copy is kept."""


def step_of(name):
  """The step number in a checkpoint's path or object name.

  'ckpt-120', '/x/ckpt-120.index', 'checkpoints/ckpt-120/COMMITTED' -> 120.
  """
  steps = re.findall(r'ckpt-(\d+)', name)
  if not steps:
    raise ValueError(f'{name!r} names no checkpoint step')
  return int(steps[-1])


class CommittedSeries:
  """One series of checkpoints (e.g. 'checkpoints') under a gs:// workdir.

  Args:
    remote: the workdir's gcs.Location.
    series: the folder under it, also the local folder's name.
    local_dir: where tf.train.CheckpointManager saves this process's files.
    max_to_keep: committed checkpoints kept on GCS; older ones are pruned.
    uploads: True for the chief, the only process that writes.
  """

  def __init__(self, remote, series, local_dir, max_to_keep, uploads):
    self.remote = remote
    self.series = series
    self.local_dir = local_dir
    self.max_to_keep = max_to_keep
    self.uploads = uploads
    self._pending = []  # Futures not yet reported, oldest first.

  @property
  def url(self):
    return f'{self.remote.url}/{self.series}'

  def _object(self, step, name):
    return f'{self.series}/ckpt-{step}/{name}'

  def committed_steps(self):
    """Steps with a COMMITTED marker on GCS, oldest first."""
    return sorted(step_of(name) for name in self.remote.list(f'{self.series}/')
                  if name.endswith('/' + MARKER))

  # --- restore ---

  def fetch_newest_first(self):
    """Downloads committed checkpoints newest first, yielding local paths.

    The chief first finishes staged uploads newer than the bucket's newest
    commit (a run stopped by an outage) and deletes uncommitted folders. A
    checkpoint whose objects are gone or fail their checksum yields a path
    that does not restore, so the caller moves on to the next older one.
    """
    committed = self.committed_steps()
    if self.uploads:
      committed = self._finish_staged(committed)
      self._delete_uncommitted(committed)
    for step in sorted(committed, reverse=True):
      yield self._download(step)

  def fetch(self, step):
    """Downloads the committed checkpoint of `step`; its local path."""
    return self._download(step)

  def _staged_root(self):
    return os.path.join(self.local_dir, 'uploading')

  def _finish_staged(self, committed):
    root = self._staged_root()
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
      step = step_of(name)
      if step > max(committed, default=-1):
        logging.info('Finishing the upload of staged checkpoint %d', step)
        self._upload(step)
        committed = committed + [step]
      else:
        shutil.rmtree(os.path.join(root, name))
    return committed

  def set_aside(self, step):
    """Uncommits a damaged checkpoint: DAMAGED replaces its COMMITTED."""
    self.remote.write_text(self._object(step, DAMAGED), 'did not restore')
    self.remote.delete(self._object(step, MARKER))
    logging.warning('Marked checkpoint %d in %s as %s; its objects are kept',
                    step, self.url, DAMAGED)

  def _delete_uncommitted(self, committed):
    names = self.remote.list(f'{self.series}/')
    kept = committed + [step_of(n) for n in names if n.endswith('/' + DAMAGED)]
    for name in names:
      if step_of(name) not in kept:
        logging.info('Deleting uncommitted %s/%s', self.remote.url, name)
        self.remote.delete(name)

  def _download(self, step):
    target = os.path.join(self.local_dir, 'restored', f'ckpt-{step}')
    if os.path.isdir(target):
      shutil.rmtree(target)  # A partial download of an earlier start.
    os.makedirs(target)
    try:
      manifest = self.remote.read_json(self._object(step, MARKER))
      for name in manifest['files']:
        self.remote.download(self._object(step, name),
                             os.path.join(target, name))
    except (exceptions.NotFound, DataCorruption, ValueError, KeyError,
            TypeError) as e:  # Gone, failed its checksum, or a bad marker.
      logging.warning('Committed checkpoint %d in %s could not be '
                      'downloaded (%s)', step, self.url, first_line(e))
    else:
      logging.info('Downloaded committed checkpoint %d from %s', step,
                   self.remote.url)
    return os.path.join(target, f'ckpt-{step}')

  # --- commit ---

  def submit(self, step):
    """Snapshots the local files of `step` and queues their upload.

    Waits only if another upload is already queued behind the running one.
    A process that does not upload (a worker other than the chief) skips it.
    """
    if not self.uploads:
      return
    staged = os.path.join(self._staged_root(), f'ckpt-{step}')
    os.makedirs(staged, exist_ok=True)
    for name in os.listdir(self.local_dir):
      if name.startswith(f'ckpt-{step}.'):
        os.link(os.path.join(self.local_dir, name), os.path.join(staged, name))
    running = [f for f in self._pending if not f.done()]
    if len(running) > 1:  # One uploading and one queued: wait for the first.
      concurrent.futures.wait(running[:1])
    previous = self._pending[-1] if self._pending else None
    future = concurrent.futures.Future()
    # A thread for each upload, ended with it, never an idle pool worker:
    # the launcher's exit joins the threads that are not daemons
    # (stopping.end_finished), and a pool's worker waits for work until its
    # pool is collected: a run that survived an outage kept it referenced
    # and hung at its end.
    threading.Thread(target=self._upload_after, args=(previous, step, future),
                     name=f'checkpoint-upload-{step}').start()
    self._pending.append(future)

  def _upload_after(self, previous, step, future):
    """Uploads `step` unless the upload before it failed: then this one
    stays staged too, for the next start to finish, and fails the same.
    Uploads run in order, each after the one before; `future` gets the
    outcome."""
    try:
      if previous is not None and previous.exception() is not None:
        raise previous.exception()
      self._upload(step)
    except BaseException as e:  # pylint: disable=broad-except
      future.set_exception(e)
    else:
      future.set_result(None)

  def _upload(self, step):
    staged = os.path.join(self._staged_root(), f'ckpt-{step}')
    checksums = {}
    for name in sorted(os.listdir(staged)):
      checksums[name] = self.remote.upload(os.path.join(staged, name),
                                           self._object(step, name))
    # The marker goes last: a checkpoint without it is never restored.
    self.remote.write_text(self._object(step, MARKER),
                           json.dumps({'step': step, 'files': checksums}))
    self.remote.delete(self._object(step, DAMAGED))  # Of an earlier try.
    shutil.rmtree(staged)
    logging.info('Committed checkpoint %d to %s', step, self.remote.url)
    self._prune()

  def _prune(self):
    for old in self.committed_steps()[:-self.max_to_keep]:
      self.remote.delete(self._object(old, MARKER))  # First: no longer counts.
      for name in self.remote.list(f'{self.series}/ckpt-{old}/'):
        self.remote.delete(name)

  def wait(self):
    """Blocks until queued uploads are committed; raises if one failed."""
    concurrent.futures.wait(self._pending)
    self.raise_if_failed()

  def raise_if_failed(self):
    """UploadError for the first finished upload that failed, once."""
    failed = next((f.exception() for f in self._pending
                   if f.done() and f.exception() is not None), None)
    self._pending = [f for f in self._pending if not f.done()]
    if failed is not None:
      raise UploadError(
          f'checkpoint upload to {self.remote.url} failed: '
          f'{getattr(failed, "detail", failed)}; the '
          f'checkpoint is kept in {self._staged_root()}; rerun the same '
          'command to upload it and resume once GCS is reachable')
