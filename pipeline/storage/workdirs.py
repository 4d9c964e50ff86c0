"""Files in the workdir: written whole or not at all, local or on GCS.

Every local write goes to a temporary name and is renamed into place, so a
crash never leaves a half-written config, metrics file or export behind; a
GCS object is replaced whole by each upload.
"""

import enum
import json
import os
import uuid

from google.api_core import exceptions
import tensorflow as tf

from pipeline.storage import gcs
from pipeline.errors import UserError
from pipeline.errors import first_line


class File(enum.StrEnum):
  """The files a run keeps at its workdir's top, each name spelled here
  alone (a checkpoint series and an export are folders of their own)."""
  RUN = 'run.json'  # The config as given and the plan (run/run_workdir.py).
  METRICS = 'metrics.json'  # A finished run's figures (reports/metrics.py).
  LOG = 'run.log'  # Its log, appended by each resume (run/console.py).
  TRACKING = 'tracking.json'  # Its trackers' run ids (training/tracking.py).
  BEST = 'best_checkpoint.json'  # keep_best_metric's best so far.


def check_writable(directory, what='workdir'):
  """Creates `directory` and proves a file can be written there."""
  probe = os.path.join(directory, f'.write-probe-{uuid.uuid4().hex}')
  try:
    tf.io.gfile.makedirs(directory)
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('ok')
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise UserError(f'{what} {directory!r} cannot be written: '
                    f'{first_line(e)}')


def check_could_write(directory, what='workdir'):
  """A one-line UserError unless `directory` could be created and written
  (it, or the nearest folder above it that exists, takes a write);
  creates nothing."""
  existing = os.path.abspath(directory)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not (os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)):
    raise UserError(f'{what} {directory!r} cannot be written: {existing} '
                    'does not take a write')


def remote_tpu_local_paths(paths):
  """The paths a TPU Node could not reach, as 'key=value' strings.

  A TPU Node's workers run the input pipeline and the file ops on their own
  hosts, which see Cloud Storage but none of this machine's files.
  `paths`: {flag: path} they would be handed: 'workdir', and the config's
  keys the source reads and the cache writes (data_dir '' is tfds' local
  one).
  """
  return [f'{key}={value!r}' for key, value in paths.items()
          if not gcs.is_gcs(value)]


def check_remote_tpu_paths(paths):
  """One-line UserError if a TPU Node would be handed a local path."""
  local = remote_tpu_local_paths(paths)
  if local:
    flags = [f'--{key}' if key == 'workdir' else f'--config.{key}'
             for key in paths]
    raise UserError(
        f'a TPU Node\'s workers run on other hosts and read only gs:// paths; '
        f'local here: {", ".join(local)}; use gs://BUCKET/PATH for each '
        f'({", ".join(flags)})')


def write_json(path, obj):
  """Writes `obj` as JSON atomically (temporary file, then rename)."""
  temporary = f'{path}.tmp-{uuid.uuid4().hex}'
  with tf.io.gfile.GFile(temporary, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=str)
    f.write('\n')
  tf.io.gfile.rename(temporary, path, overwrite=True)


def read_json(path):
  """The JSON object at `path`, or None if there is no such file."""
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def replace_dir(source, target):
  """Moves directory `source` to `target`, replacing what was there."""
  old = f'{target}.old-{uuid.uuid4().hex}'
  if tf.io.gfile.exists(target):
    tf.io.gfile.rename(target, old)
  tf.io.gfile.rename(source, target)
  if tf.io.gfile.exists(old):
    tf.io.gfile.rmtree(old)


class Workdir:
  """A run's directory: local, or gs:// with a local staging copy.

  Everything is written locally first (TensorFlow and Keras write files);
  for a gs:// workdir `publish()` then uploads. Checkpoints have their own
  commit protocol (checkpoint.py); this class carries the small files.
  """

  def __init__(self, url, staging_root, timeout_s=120.0, lease_s=120.0):
    self.url = url
    self.staging_root = staging_root
    self.lease_s = lease_s  # A gs:// writer's lease (workdir_lock.py).
    if gcs.is_gcs(url):
      self.remote = gcs.Location(url, timeout_s)
      bucket, prefix = gcs.split_url(url)
      self.local = os.path.join(staging_root, bucket, prefix)
    else:
      self.remote = None
      self.local = url
    self._published = {}  # relative path -> (size, mtime) last uploaded

  def path(self, *parts):
    return os.path.join(self.local, *parts)

  def check(self, create=True):
    """Local writability, and for gs:// the bucket preflight; not `create`
    (a dry run): the local folder, or the nearest that exists above it,
    must take a write, and nothing is created."""
    if create:
      check_writable(self.local)
    else:
      check_could_write(self.local)
    if self.remote:
      self.remote.preflight()

  def read_json(self, relative):
    """A workdir file's JSON, None if absent; a damaged one is one line."""
    try:
      if self.remote:
        return self.remote.read_json(relative)
      return read_json(self.path(relative))
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError.
      raise UserError(f'{self.url}/{relative} is damaged ({first_line(e)}); '
                      'move it aside (the run writes it anew from the '
                      'config) or use another --workdir') from None

  def write_json(self, relative, obj):
    write_json(self.path(relative), obj)
    self.publish(relative)

  def fetch(self, relative):
    """Downloads a gs:// workdir's `relative` into an empty staging copy, so
    a run resumed on another machine appends to its log instead of
    replacing it. Nothing happens where the file is local or absent."""
    local = self.path(relative)
    if not self.remote or os.path.exists(local):
      return
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
      self.remote.download(relative, local)
    except exceptions.NotFound:
      if os.path.exists(local):  # What the client may leave behind.
        os.remove(local)

  def publish(self, relative):
    """Uploads one file or every changed file under a directory."""
    if not self.remote:
      return
    root = self.path(relative)
    paths = [root] if os.path.isfile(root) else [
        os.path.join(folder, name)
        for folder, _, names in os.walk(root) for name in names]
    for path in paths:
      stat = os.stat(path)
      key = os.path.relpath(path, self.local)
      if self._published.get(key) != (stat.st_size, stat.st_mtime):
        self.remote.upload(path, key)
        self._published[key] = (stat.st_size, stat.st_mtime)
