"""The exported model: uint8 images in, float32 class probabilities out."""

import os
import tempfile

import tensorflow as tf

from pipeline import models
from pipeline import storage


def export_model(model, workdir, is_chief):
  """Saves a SavedModel to <workdir>/export atomically; returns its URL.

  Every worker traces the export (tf.distribute may need all of them in the
  save); only the chief's copy is kept, written under a temporary name and
  renamed into place, then uploaded for a gs:// workdir.
  """
  target = workdir.path('export')
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  models.with_softmax(model).export(staging, verbose=False)
  if not is_chief:
    tf.io.gfile.rmtree(staging)
    return None
  storage.replace_dir(staging, target)
  workdir.publish('export')
  return f'{workdir.url}/export'
