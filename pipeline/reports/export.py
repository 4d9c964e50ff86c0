"""The exported model: uint8 images in, float32 class probabilities out."""

import os
import tempfile

import tensorflow as tf

from pipeline import backends
from pipeline.data import decode
from pipeline.storage import workdirs


METADATA = 'metadata.json'
TFLITE = 'model.tflite'


def export_run(plan, trainer, name='export'):
  """The trainer's model (its moving average, if kept) exported into
  `<workdir>/<name>` as export_model writes it; the export's URL."""
  config = plan.config
  with trainer.exported_weights():
    return export_model(
        trainer.model, plan.workdir, plan.hardware.is_chief,
        metadata(plan), name=name, tflite=config.export_tflite,
        io_device=plan.io_device, backend=plan.backend)


def export_model(model, workdir, is_chief, metadata, name='export',
                 tflite='', io_device=None, backend=None):
  """Saves a SavedModel to <workdir>/<name> atomically; returns its URL.

  `metadata` (class names, image size, preprocessing) goes beside it as
  metadata.json, so launch.predict needs nothing but the export; with
  `tflite` ('float32' or 'float16') a LiteRT model.tflite too, each
  written by the `backend` (TensorFlow's where None). Every
  worker traces the export (tf.distribute may need all of them in the
  save); only the chief's copy is kept, written under a temporary name and
  renamed into place, then uploaded for a gs:// workdir. `io_device`
  '/job:localhost' keeps a TPU Node's file writes on this host, as the
  checkpoints do.
  """
  target = workdir.path(name)
  staging = (f'{target}.tmp-{os.getpid()}' if is_chief else
             tempfile.mkdtemp(prefix='export-worker-'))
  backend = backend or backends.load('tensorflow')
  backend.write_saved_model(model, metadata, staging, io_device)
  if not is_chief:
    tf.io.gfile.rmtree(staging)
    return None
  if tflite:
    backend.write_tflite(model.get_weights(), metadata,
                         os.path.join(staging, TFLITE), tflite)
  workdirs.write_json(os.path.join(staging, METADATA),
                     dict(metadata, tflite=TFLITE if tflite else None))
  workdirs.replace_dir(staging, target)
  workdir.publish(name)
  return f'{workdir.url}/{name}'


def metadata(plan):
  """What a user of the export needs to know: classes, input, preprocessing."""
  config = plan.config
  source = plan.source
  return {
      'model': config.model,
      'dataset': source.name,
      'class_names': [source.class_name(i) for i in range(source.num_classes)],
      'input': 'uint8 RGB images [batch, image_size, image_size, 3]',
      'output': 'float32 class probabilities [batch, num_classes]',
      'preprocessing': decode.eval_preprocessing(plan.input),
  }
