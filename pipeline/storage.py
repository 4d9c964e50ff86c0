"""Files in the workdir: written whole or not at all.

Every write goes to a temporary name and is renamed into place, so a crash
never leaves a half-written config, metrics file or export behind.
"""

import json
import os
import uuid

import tensorflow as tf

from pipeline.errors import UserError


def check_writable(workdir):
  """Creates `workdir` and proves a file can be written there."""
  probe = os.path.join(workdir, f'.write-probe-{uuid.uuid4().hex}')
  try:
    tf.io.gfile.makedirs(workdir)
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('ok')
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    reason = getattr(e, 'message', None) or str(e)
    raise UserError(f'workdir {workdir!r} cannot be written: '
                    f'{reason.strip().splitlines()[0]}')


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
