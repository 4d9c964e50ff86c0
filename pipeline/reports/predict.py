"""Predictions from image files with an export of launch.train.

The export's metadata.json names the classes and the preprocessing; images
of any size go through exactly what evaluation does (decode.eval_image), in
batches, through the SavedModel's `serve` signature, or the export's
model.onnx through onnxruntime.
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


class OnnxModel:
  """An export's model.onnx, served as the SavedModel is: serve(uint8
  images) -> class probabilities."""

  def __init__(self, path):
    import onnxruntime  # pylint: disable=g-import-not-at-top
    self.session = onnxruntime.InferenceSession(
        path, providers=['CPUExecutionProvider'])
    self.input_name = self.session.get_inputs()[0].name

  def serve(self, images):
    return self.session.run(None, {self.input_name: np.asarray(images)})[0]


def load(path):
  """(the export's model, its metadata), or a one-line UserError. `path`:
  an export folder (its SavedModel) or the model.onnx in one."""
  onnx = path.endswith('.onnx')
  export_dir = os.path.dirname(path) if onnx else path
  try:
    with tf.io.gfile.GFile(os.path.join(export_dir, export.METADATA)) as f:
      metadata = json.load(f)
    if onnx:
      return _onnx_model(path), metadata
    model = tf.saved_model.load(export_dir)
  except (tf.errors.OpError, OSError, ValueError) as e:
    raise UserError(f'{path} is not an export of launch.train (the '
                    f'<workdir>/export folder with {export.METADATA}, or '
                    f'its {export.ONNX}): {first_line(e)}') from None
  return model, metadata


def _onnx_model(path):
  """OnnxModel, or a one-line UserError for a file onnxruntime cannot
  read or a missing onnxruntime."""
  try:
    return OnnxModel(path)
  except ImportError:
    raise UserError(f'{path}: reading ONNX needs onnxruntime (pip install '
                    '-r requirements-onnx.txt)') from None
  except Exception as e:  # pylint: disable=broad-except  # onnxruntime's own.
    raise UserError(f'{path} is not an ONNX model onnxruntime reads: '
                    f'{first_line(e)}') from None


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
  return np.concatenate([np.asarray(model.serve(images[i:i + batch_size]))
                         for i in range(0, len(images), batch_size)])


def top_k(probs, class_names, k):
  """[(class name, probability)] of the k likeliest classes, per image."""
  k = min(k, probs.shape[1])
  order = np.argsort(-probs, axis=1)[:, :k]
  return [[(class_names[c], float(p[c])) for c in row]
          for p, row in zip(probs, order)]
