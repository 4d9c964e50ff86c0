"""What only TensorFlow writes, for either backend: the SavedModel export
and LiteRT (model.tflite). Backend.write_saved_model and write_tflite.

A JAX run has them written by a child process on Keras' TensorFlow backend
from the same weights (Keras fixes its backend per process; the JAX
environment has TensorFlow's CPU build): Keras 3.15 writes LiteRT from
TensorFlow or PyTorch only, the converter rejects a JAX SavedModel's
random-generator state (uint32), and a SavedModel traced on JAX 0.11
holds StableHLO 1.18, which TensorFlow 2.21 cannot read ("failed to
deserialize portable artifact using StableHLO_v1.13.7"). Rebuilt on
TensorFlow, the export is a plain TensorFlow graph whichever backend
trained it.
"""

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


def write_saved_model(model, path, io_device=None):
  """`model` with a float32 softmax as a SavedModel at `path`, its one
  endpoint 'serve' (uint8 images -> class probabilities): Keras'
  model.export, with the SaveOptions it does not pass through."""
  archive = keras.export.ExportArchive()
  archive.track_and_add_endpoint(
      'serve', models.with_softmax(model),
      [tf.TensorSpec(model.input.shape, model.input.dtype)])
  archive.write_out(path, verbose=False, options=tf.saved_model.SaveOptions(
      experimental_io_device=io_device))


def write_tflite(weights, metadata, path, kind):
  """A LiteRT model of a float32 rebuild of the model with `weights`,
  written to `path`.

  The converter does not take a mixed-precision graph, so the same
  architecture is built under the float32 policy and given the trained
  weights (variables are float32 under every policy). 'float16' stores the
  weights in float16 (half the size; computes in float32 where the device
  has no float16). Keras' own LiteRT export does the conversion.
  """
  rebuilt = models.with_softmax(_rebuilt(weights, {**metadata,
                                                   'policy': 'float32'}))
  options = {} if kind == 'float32' else {
      'optimizations': [tf.lite.Optimize.DEFAULT],
      'target_spec': {'supported_types': [tf.float16]}}
  rebuilt.export(path, format='litert', verbose=False, **options)


def _rebuilt(weights, spec):
  """The network `spec` names (its 'model', 'class_names', preprocessing's
  'image_size', 'policy'), built with `weights`; the global policy as it
  was after."""
  policy = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(spec['policy'])
  try:
    model = models.build_model(spec['model'], len(spec['class_names']),
                               spec['preprocessing']['image_size'])
  finally:
    keras.mixed_precision.set_global_policy(policy)
  model.set_weights(weights)
  return model


def on_tensorflow(task, weights, metadata, path, kind=''):
  """Runs `task` ('saved_model' or 'tflite') in a child process on Keras'
  TensorFlow backend, from `weights` and the export's `metadata` (with the
  run's 'policy')."""
  with tempfile.TemporaryDirectory() as folder:
    np.savez(os.path.join(folder, 'weights.npz'), *weights)
    workdirs.write_json(os.path.join(folder, _METADATA), metadata)
    child = subprocess.run(
        [sys.executable, '-m', 'pipeline.backends.tensorflow_exports', task,
         folder, path, kind], env=dict(os.environ, KERAS_BACKEND='tensorflow'),
        capture_output=True, text=True, check=False)
  if child.returncode:
    raise RuntimeError(f'writing the {task} on TensorFlow failed: ' +
                       (child.stderr.strip() or 'no output')[-2000:])


def _main(task, folder, path, kind):
  """on_tensorflow's child: writes `task` from the weights in `folder`."""
  with np.load(os.path.join(folder, 'weights.npz')) as saved:
    weights = [saved[f'arr_{i}'] for i in range(len(saved.files))]
  metadata = workdirs.read_json(os.path.join(folder, _METADATA))
  if task == 'saved_model':
    write_saved_model(_rebuilt(weights, metadata), path)
  else:
    write_tflite(weights, metadata, path, kind)


if __name__ == '__main__':
  _main(*sys.argv[1:])
