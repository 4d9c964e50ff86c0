"""The exported model: uint8 images in, float32 class probabilities out."""

import os
import tempfile

from absl import logging
import tensorflow as tf

from pipeline import backends
from pipeline.recipe import models
from pipeline.data import decode
from pipeline.storage import workdirs


METADATA = 'metadata.json'
TFLITE = 'model.tflite'
ONNX = 'model.onnx'
KERAS = 'model.keras'
# The largest difference in probability the ONNX model may have from the
# SavedModel on the check batch: float32 against float32 differs by
# ~1e-7 (measured, BUILD_NOTES.md); a wrong conversion by far more.
ONNX_TOLERANCE = 1e-4
ONNX_CHECK_IMAGES = 32  # The batch both are run on.


def export_run(plan, trainer, name='export'):
  """The trainer's model (its moving average, if kept) exported into
  `<workdir>/<name>` as export_model writes it; the export's URL."""
  config, described = plan.outputs, metadata(plan)
  with trainer.exported_weights():
    return export_model(
        trainer.model, plan.workdir, plan.hardware.is_chief, described,
        name=name, tflite=config.export_tflite, onnx=config.export_onnx,
        io_device=plan.io_device, backend=plan.backend,
        keras_file=(plan.recipe.model, plan.source.num_classes))


def export_model(model, workdir, is_chief, metadata, name='export',
                 tflite='', onnx=False, io_device=None, backend=None,
                 keras_file=None):
  """Saves a SavedModel to <workdir>/<name> atomically; returns its URL.

  `metadata` (class names, image size, preprocessing) goes beside it as
  metadata.json, so launch.predict needs nothing but the export. With
  `tflite` ('float32' or 'float16') a LiteRT model.tflite too, with `onnx`
  a model.onnx (onnx_fields), each written by the `backend` (TensorFlow's
  where None); with `keras_file` (the network's name and classes) a
  model.keras (plain_keras). Every worker traces the export (tf.distribute
  may need all of them in the save); only the chief's copy is kept,
  written under a temporary name and renamed into place, then uploaded for
  a gs:// workdir. `io_device` '/job:localhost' keeps a TPU Node's file
  writes on this host, as the checkpoints do.
  """
  target = workdir.path(name)
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  backend = backend or backends.load('tensorflow')
  backend.export('saved_model', model, metadata, staging,
                 io_device=io_device)
  if not is_chief:
    tf.io.gfile.rmtree(staging)
    return None
  if tflite:
    backend.export('tflite', model, metadata, os.path.join(staging, TFLITE),
                   tflite)
  onnx_written = {'onnx': None}
  if onnx:
    # A 16-bit model's ONNX is a float32 rebuild's, checked against that
    # rebuild's SavedModel (Backend.export).
    policy = model.dtype_policy.name
    difference = backend.export('onnx', model, dict(metadata, policy=policy),
                                os.path.join(staging, ONNX),
                                ONNX_CHECK_IMAGES, staging)
    onnx_written = onnx_fields(difference, policy, staging)
  if keras_file:
    plain_keras(model, *keras_file).save(os.path.join(staging, KERAS))
  workdirs.write_json(os.path.join(staging, METADATA),
                     dict(metadata, tflite=TFLITE if tflite else None,
                          **onnx_written))
  workdirs.replace_dir(staging, target)
  workdir.publish(name)
  return f'{workdir.url}/{name}'


def plain_keras(model, name, num_classes):
  """What model.keras holds: the trained network `model` (of `name`) for a
  Keras user to `keras.models.load_model` and fit on: a float32 rebuild
  with keras.applications' layers (readable without this project) that
  takes uint8 or float images of any size and gives logits, as the model
  trained (compile it with a loss from_logits=True). Keras' format is the
  same from either backend."""
  return models.rebuilt(name, num_classes, model.get_weights())


def onnx_fields(difference, policy, staging):
  """metadata.json's fields for the model.onnx in `staging`, whose
  probabilities differ by `difference` from the SavedModel's it was
  converted from (a `policy` model's): kept only within ONNX_TOLERANCE."""
  fields = {'onnx': ONNX, 'onnx_max_difference': difference,
            'onnx_tolerance': ONNX_TOLERANCE,
            'onnx_checked_against': 'the SavedModel' if policy == 'float32'
                                    else "a float32 rebuild's SavedModel "
                                    f'(the SavedModel computes in {policy})'}
  if difference <= ONNX_TOLERANCE:
    logging.info('Exported %s: its probabilities within %.1e of %s on %d '
                 'images', ONNX, difference, fields['onnx_checked_against'],
                 ONNX_CHECK_IMAGES)
    return fields
  os.remove(os.path.join(staging, ONNX))
  logging.warning('%s not written: its probabilities differ from those of '
                  '%s by %.3g on %d images, over the %.0e accepted', ONNX,
                  fields['onnx_checked_against'], difference,
                  ONNX_CHECK_IMAGES, ONNX_TOLERANCE)
  return dict(fields, onnx=None)


def metadata(plan):
  """What a user of the export needs to know: classes, input, preprocessing."""
  source = plan.source
  return {
      'model': plan.recipe.model,
      'dataset': source.name,
      'class_names': [source.class_name(i) for i in range(source.num_classes)],
      'input': 'uint8 RGB images [batch, image_size, image_size, 3]',
      # Served at the evaluation size (preprocessing's image_size).
      'train_image_size': plan.image_sizes.train,
      'output': 'float32 class probabilities [batch, num_classes]',
      'keras_file': f'{KERAS}: the network (logits out) for '
                    'keras.models.load_model',
      'preprocessing': decode.eval_preprocessing(plan.input),
  }
