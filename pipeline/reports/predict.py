"""Predictions from image files with an export of launch.train.

The export's metadata.json names the classes and the preprocessing; images
of any size go through exactly what evaluation does (decode.eval_image), in
batches, through the SavedModel's `serve` signature.
"""

import glob
import json
import os

import numpy as np
import tensorflow as tf

from pipeline.data import decode
from pipeline.reports import export
from pipeline.errors import UserError
from pipeline.errors import first_line


def load(export_dir):
  """(the loaded SavedModel, its metadata), or a one-line UserError."""
  path = os.path.join(export_dir, export.METADATA)
  try:
    with tf.io.gfile.GFile(path) as f:
      metadata = json.load(f)
    model = tf.saved_model.load(export_dir)
  except (tf.errors.OpError, OSError, ValueError) as e:
    raise UserError(f'{export_dir} is not an export of launch.train (the '
                    f'<workdir>/export folder with {export.METADATA}): '
                    f'{first_line(e)}') from None
  return model, metadata


def expand(patterns):
  """File paths from paths and globs, in order; a pattern matching none is
  reported by the caller like a bad file."""
  found = []
  for pattern in patterns:
    matches = sorted(glob.glob(pattern)) or [pattern]
    found.extend(m for m in matches if not os.path.isdir(m))
  return found


def read_images(paths, preprocessing):
  """(uint8 images, the paths read, [(path, reason)] of those skipped)."""
  images, kept, skipped = [], [], []
  size = preprocessing['image_size']
  # Exports before central_fraction recorded decode_size (size / fraction).
  fraction = preprocessing.get('central_fraction',
                               size / preprocessing.get('decode_size', size))
  for path in paths:
    try:
      with open(path, 'rb') as f:
        encoded = f.read()
      images.append(decode.eval_image(encoded, size, fraction).numpy())
      kept.append(path)
    except (OSError, tf.errors.OpError) as e:
      skipped.append((path, first_line(e)))
  return np.stack(images) if images else None, kept, skipped


def probabilities(model, images, batch_size=32):
  """Class probabilities of uint8 images, `batch_size` at a time."""
  return np.concatenate([model.serve(images[i:i + batch_size]).numpy()
                         for i in range(0, len(images), batch_size)])


def top_k(probs, class_names, k):
  """[(class name, probability)] of the k likeliest classes, per image."""
  k = min(k, probs.shape[1])
  order = np.argsort(-probs, axis=1)[:, :k]
  return [[(class_names[c], float(p[c])) for c in row]
          for p, row in zip(probs, order)]
