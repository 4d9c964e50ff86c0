"""What only TensorFlow writes, for either backend: the SavedModel export,
LiteRT (model.tflite) and ONNX (model.onnx): Backend.export, by task
('saved_model', 'tflite', 'onnx').

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

import json
import os
import subprocess
import sys
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from pipeline.recipe import models
from pipeline.storage import workdirs
from pipeline.launchers import Launcher
from pipeline import launchers

_METADATA = 'metadata.json'


def write_saved_model(model, path, io_device=None, image_size=None):
  """`model` with a float32 softmax as a SavedModel at `path`, its one
  endpoint 'serve' (uint8 images -> class probabilities) at `image_size`
  (the evaluation size; None: the model's input size): Keras'
  model.export, with the SaveOptions it does not pass through."""
  shape = ([None, image_size, image_size, 3] if image_size else
           model.input.shape)
  archive = keras.export.ExportArchive()
  archive.track_and_add_endpoint(
      'serve', models.with_softmax(model),
      [tf.TensorSpec(shape, model.input.dtype)])
  archive.write_out(path, verbose=False, options=tf.saved_model.SaveOptions(
      experimental_io_device=io_device))


def write(task, model, metadata, path, *args, io_device=None):
  """Backend.export on TensorFlow: `task` of `model`, in this process."""
  if task == 'saved_model':
    # Served at the evaluation size; without one, the model's input's.
    return write_saved_model(
        model, path, io_device,
        metadata.get('preprocessing', {}).get('image_size'))
  return _FROM_WEIGHTS[task](model.get_weights(), metadata, path, *args)


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


ONNX_OPSET = 17


def write_onnx(weights, metadata, path, check_images, export_dir):
  """An ONNX model of the network with `weights` at `path` (uint8 images
  in, probabilities out, as the export's `serve`); returns the largest
  difference in probability between it and the SavedModel it was
  converted from, on the same batch of `check_images` random images
  (onnxruntime against TensorFlow).

  Converted from the SavedModel export at `export_dir` where it computes
  in float32 (metadata's 'policy'); else from a float32 rebuild's, as
  LiteRT's is: onnxruntime runs no mixed bfloat16 graph ("Type parameter
  (T) of Optype (Mul) bound to different types"), and a float32 model is
  what serving stacks take.
  """
  with tempfile.TemporaryDirectory() as folder:
    source = export_dir
    if metadata['policy'] != 'float32':
      source = os.path.join(folder, 'float32')
      write_saved_model(_rebuilt(weights, {**metadata, 'policy': 'float32'}),
                        source)
    return _converted_and_checked(source, path, check_images)


def _converted_and_checked(saved_model, path, check_images):
  """tf2onnx of the SavedModel's `serve`, its variables frozen into
  constants (Keras' own ONNX export, tf2onnx from the model's function,
  leaves the Normalization layer's mean and variance as extra graph
  inputs); the largest difference in probability from it."""
  import onnxruntime  # pylint: disable=g-import-not-at-top
  import tf2onnx  # pylint: disable=g-import-not-at-top
  # Private, as no public API patches tf2onnx for numpy 2 (Keras' own).
  from keras.src.export import tf2onnx_lib  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import convert_to_constants  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import deprecation  # pylint: disable=g-import-not-at-top
  loaded = tf.saved_model.load(saved_model)  # Holds the variables.
  function = loaded.serve.get_concrete_function()
  frozen = convert_to_constants.convert_variables_to_constants_v2(function)
  with warnings.catch_warnings():  # numpy's FutureWarning on np.object.
    warnings.simplefilter('ignore', FutureWarning)
    tf2onnx_lib.patch_tf2onnx()  # Keras' fix for tf2onnx under numpy 2.
  with deprecation.silence():  # tf2onnx's TensorFlow 1 calls, each a warning.
    tf2onnx.convert.from_graph_def(
        frozen.graph.as_graph_def(),
        input_names=[t.name for t in frozen.inputs],
        output_names=[t.name for t in frozen.outputs],
        opset=ONNX_OPSET, output_path=path)
  shape = [check_images, *function.inputs[0].shape[1:]]
  images = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
  session = onnxruntime.InferenceSession(
      path, providers=['CPUExecutionProvider'])
  ours = session.run(None, {session.get_inputs()[0].name: images})[0]
  return float(np.abs(ours - loaded.serve(images).numpy()).max())


def _rebuilt(weights, spec):
  """The network `spec` names (its 'model', 'class_names', preprocessing's
  'image_size', 'policy'), built with `weights`."""
  return models.rebuilt(spec['model'], len(spec['class_names']), weights,
                        spec['preprocessing']['image_size'], spec['policy'])


def on_tensorflow(task, weights, metadata, path, *args):
  """Runs `task` ('saved_model', 'tflite' or 'onnx', with the rest of its
  arguments) in a child process on Keras' TensorFlow backend, from
  `weights` and the export's `metadata` (with the run's 'policy'); what
  the task returned."""
  with tempfile.TemporaryDirectory() as folder:
    np.savez(os.path.join(folder, 'weights.npz'), *weights)
    workdirs.write_json(os.path.join(folder, _METADATA), metadata)
    child = subprocess.run(
        launchers.command(Launcher.EXPORT_TASK, task, folder, path,
                          json.dumps(args)),
        env=dict(os.environ, KERAS_BACKEND='tensorflow'),
        capture_output=True, text=True, check=False)
  if child.returncode:
    raise RuntimeError(f'writing the {task} on TensorFlow failed: ' +
                       (child.stderr.strip() or 'no output')[-2000:])
  return json.loads(child.stdout.strip().splitlines()[-1])


def _main(task, folder, path, args):
  """on_tensorflow's child: writes `task` from the weights in `folder`,
  and prints what it returned as its last line."""
  with np.load(os.path.join(folder, 'weights.npz')) as saved:
    weights = [saved[f'arr_{i}'] for i in range(len(saved.files))]
  metadata = workdirs.read_json(os.path.join(folder, _METADATA))
  args = json.loads(args)
  print(json.dumps(write_saved_model(_rebuilt(weights, metadata), path)
                   if task == 'saved_model' else
                   _FROM_WEIGHTS[task](weights, metadata, path, *args)))


_FROM_WEIGHTS = {'tflite': write_tflite, 'onnx': write_onnx}


if __name__ == '__main__':
  _main(*sys.argv[1:])
