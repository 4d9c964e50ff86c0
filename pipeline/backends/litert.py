"""The exported model as LiteRT (model.tflite), which only TensorFlow's
converter writes: Backend.write_tflite of either backend."""

import os
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from pipeline.recipe import models
from pipeline.storage import workdirs

_METADATA = 'metadata.json'


def convert_to_tflite_on_tensorflow(weights, metadata, path, kind):
  """convert_to_tflite from Keras' JAX backend: Keras 3.15 writes LiteRT from
  TensorFlow or PyTorch only, and the converter rejects the JAX SavedModel's
  random-generator state (uint32). Keras fixes its backend per process, and
  the JAX environment has TensorFlow's CPU build, so a child process on the
  TensorFlow backend converts the same weights."""
  with tempfile.TemporaryDirectory() as folder:
    np.savez(os.path.join(folder, 'weights.npz'), *weights)
    workdirs.write_json(os.path.join(folder, _METADATA), metadata)
    child = subprocess.run(
        [sys.executable, '-m', 'pipeline.backends.litert', folder, path, kind],
        env=dict(os.environ, KERAS_BACKEND='tensorflow'),
        capture_output=True, text=True, check=False)
  if child.returncode:
    raise RuntimeError('the LiteRT conversion on TensorFlow failed: ' +
                       (child.stderr.strip() or 'no output')[-2000:])


def convert_to_tflite(weights, metadata, path, kind):
  """A LiteRT model of a float32 rebuild of the model with `weights`,
  written to `path`, on Keras' TensorFlow backend.

  The converter does not take a mixed-precision graph, so the same
  architecture is built under the float32 policy and given the trained
  weights (variables are float32 under every policy). 'float16' stores the
  weights in float16 (half the size; computes in float32 where the device
  has no float16). Keras' own LiteRT export does the conversion.
  """
  policy = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy('float32')
  try:
    rebuilt = models.with_softmax(models.build_model(
        metadata['model'], len(metadata['class_names']),
        metadata['preprocessing']['image_size']))
  finally:
    keras.mixed_precision.set_global_policy(policy)
  rebuilt.set_weights(weights)
  options = {} if kind == 'float32' else {
      'optimizations': [tf.lite.Optimize.DEFAULT],
      'target_spec': {'supported_types': [tf.float16]}}
  rebuilt.export(path, format='litert', verbose=False, **options)


def _main(folder, path, kind):
  """convert_to_tflite_on_tensorflow's child: converts the weights in
  `folder`."""
  with np.load(os.path.join(folder, 'weights.npz')) as saved:
    weights = [saved[f'arr_{i}'] for i in range(len(saved.files))]
  convert_to_tflite(weights, workdirs.read_json(os.path.join(folder, _METADATA)),
                    path, kind)


if __name__ == '__main__':
  _main(*sys.argv[1:])
