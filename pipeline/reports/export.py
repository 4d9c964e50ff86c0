"""The exported model: uint8 images in, float32 class probabilities out."""

import os
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from pipeline.data import decode
from pipeline.training import models
from pipeline.storage import workdirs


METADATA = 'metadata.json'
TFLITE = 'model.tflite'


def convert_to_tflite_on_tensorflow(weights, metadata, path, kind):
  """convert_to_tflite from Keras' JAX backend: Keras 3.15 writes LiteRT from
  TensorFlow or PyTorch only, and the converter rejects the JAX SavedModel's
  random-generator state (uint32). Keras fixes its backend per process, and
  the JAX environment has TensorFlow's CPU build, so a child process on the
  TensorFlow backend converts the same weights."""
  with tempfile.TemporaryDirectory() as folder:
    np.savez(os.path.join(folder, 'weights.npz'), *weights)
    workdirs.write_json(os.path.join(folder, METADATA), metadata)
    child = subprocess.run(
        [sys.executable, '-m', 'pipeline.reports.export', folder, path, kind],
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


def export_run(config, plan, trainer, name='export'):
  """The trainer's model (its moving average, if kept) exported into
  `<workdir>/<name>` as export_model writes it; the export's URL."""
  with trainer.exported_weights():
    return export_model(
        trainer.model, plan.workdir, plan.hardware.is_chief,
        metadata(config, plan), name=name, tflite=config.export_tflite,
        io_device=plan.io_device, write_tflite=plan.backend.write_tflite)


def export_model(model, workdir, is_chief, metadata, name='export',
                 tflite='', io_device=None, write_tflite=None):
  """Saves a SavedModel to <workdir>/<name> atomically; returns its URL.

  `metadata` (class names, image size, preprocessing) goes beside it as
  metadata.json, so launch.predict needs nothing but the export; with
  `tflite` ('float32' or 'float16') a LiteRT model.tflite too, by the
  backend's `write_tflite(weights, metadata, path, kind)`. Every
  worker traces the export (tf.distribute may need all of them in the
  save); only the chief's copy is kept, written under a temporary name and
  renamed into place, then uploaded for a gs:// workdir. `io_device`
  '/job:localhost' keeps a TPU Node's file writes on this host, as the
  checkpoints do.
  """
  target = workdir.path(name)
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  # Keras' model.export, with the SaveOptions it does not pass through.
  archive = keras.export.ExportArchive()
  archive.track_and_add_endpoint(
      'serve', models.with_softmax(model),
      [tf.TensorSpec(model.input.shape, model.input.dtype)])
  archive.write_out(staging, verbose=False, options=tf.saved_model.SaveOptions(
      experimental_io_device=io_device))
  if not is_chief:
    tf.io.gfile.rmtree(staging)
    return None
  if tflite:
    write_tflite(model.get_weights(), metadata,
                 os.path.join(staging, TFLITE), tflite)
  workdirs.write_json(os.path.join(staging, METADATA),
                     dict(metadata, tflite=TFLITE if tflite else None))
  workdirs.replace_dir(staging, target)
  workdir.publish(name)
  return f'{workdir.url}/{name}'


def metadata(config, plan):
  """What a user of the export needs to know: classes, input, preprocessing."""
  source = plan.source
  return {
      'model': config.model,
      'dataset': source.name,
      'class_names': [source.class_name(i) for i in range(source.num_classes)],
      'input': 'uint8 RGB images [batch, image_size, image_size, 3]',
      'output': 'float32 class probabilities [batch, num_classes]',
      'preprocessing': decode.eval_preprocessing(config),
  }


def _main(folder, path, kind):
  """convert_to_tflite_on_tensorflow's child: converts the weights in
  `folder`."""
  with np.load(os.path.join(folder, 'weights.npz')) as saved:
    weights = [saved[f'arr_{i}'] for i in range(len(saved.files))]
  convert_to_tflite(weights, workdirs.read_json(os.path.join(folder, METADATA)),
                    path, kind)


if __name__ == '__main__':
  _main(*sys.argv[1:])
