"""Fine-tuning: a new run's backbone from published or earlier weights.

`init_from` names where the backbone's first weights come from:
  imagenet     keras.applications' published ImageNet weights of the model,
               downloaded by Keras once (into ~/.keras/models);
  a file       local or gs://: weights of the same headless network, such as
               Keras' own efficientnetb0_notop.h5 fetched by hand;
  a workdir    another run of launch.train (local or gs://): its newest
               committed checkpoint, its moving average if it kept one;
               trained on either backend, read on either.
The head is new (this run's classes), except that a run's head comes too
when it trained these very class names (`init_head`, on by default: a
warm start); a run of other names is refused unless init_head=False takes
its backbone alone. Only a run that starts at step 0 loads them; a resumed
run restores its own checkpoint instead.

With `freeze_backbone_epochs`, the backbone is frozen for that long (batch
norm in inference mode) while the head learns, then the whole model
trains (the backend's Trainer.train).
"""

import os
import re
import tempfile

import keras
import tensorflow as tf

from pipeline import backends
from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.rules.config import init_from as init_from_lib
from pipeline.rules.config import validation
from pipeline.storage import checkpoint_files
from pipeline.storage.checkpoint import Checkpointer
from pipeline.recipe import models
from pipeline.recipe import moving_average

def load_init_from(config, model, class_names, staging_dir):
  """Loads `config.init_from` into `model` (these data's `class_names`):
  its backbone, and a run's head where init_from_lib.carries_head says so.
  Returns what it did."""
  init_from = config.init_from
  if init_from == 'imagenet':
    source = _published(config)
  elif init_from_lib.WEIGHTS_FILE.search(init_from):
    source = _from_file(config, init_from)
  else:
    return _from_run(config, init_from, model, class_names, staging_dir)
  models.backbone(model).set_weights(source.get_weights())
  return init_from_lib.describe(init_from)


def _headless(config, weights):
  return models.MODELS[config.model](
      include_top=False, weights=weights, pooling='avg',
      input_shape=(config.image_size, config.image_size, 3))


def _published(config):
  try:
    return _headless(config, 'imagenet')
  except Exception as e:  # pylint: disable=broad-except
    # Keras raises a bare Exception for a failed download.
    url = re.search(r'https?://\S+?\.h5', str(e))
    where = url.group(0) if url else "Keras' published weights"
    raise UserError(
        f"init_from=imagenet: downloading {config.model}'s ImageNet weights "
        f'failed ({first_line(e)}); without network, fetch {where} '
        'elsewhere and pass its path as --config.init_from=PATH') from None


def published_file(model):
  """The name Keras 3 gives `model`'s published headless ImageNet weights
  (the network's own name + '_notop.h5': efficientnetb0_notop.h5,
  efficientnetv2-b0_notop.h5)."""
  family, size = model.split('_')
  return f'{family}{"-" if family.endswith("v2") else ""}{size}_notop.h5'


def _from_file(config, path):
  init_from_lib.check_source(config, (), '')
  with tempfile.TemporaryDirectory() as folder:
    local = path
    if '://' in path:  # h5py reads local files only.
      local = os.path.join(folder, os.path.basename(path))
      tf.io.gfile.copy(path, local)
    try:
      return _headless(config, local)
    except (ValueError, OSError) as e:
      raise UserError(f'init_from={path!r} does not load into the headless '
                      f'{config.model} ({first_line(e)}); pass weights of '
                      f"that network, e.g. Keras' {published_file(config.model)}"
                      ) from None


def _from_run(config, url, model, class_names, staging_dir):
  """Another run's newest committed checkpoint: its backbone, and its head
  if it trained these classes and init_head is on."""
  workdir, saved = init_from_lib.source_run(config, url, staging_dir)
  carried = (class_names if init_from_lib.carries_head(config, saved,
                                                       class_names) else ())
  theirs = validation.complete(saved['config'], source=f'{url}/run.json')
  # Restored whole, at any image size (no weight depends on it); a head of
  # other classes is dropped.
  source = models.build_model(theirs.model,
                              saved['resolved']['num_classes'],
                              config.image_size)
  checkpointer, averages = _reader(workdir, source, theirs.ema_decay,
                                   saved['resolved'])
  step = checkpointer.restore_latest()
  if step is None:
    raise UserError(f'init_from={url!r} has no committed checkpoint yet')
  if averages:  # Their moving average is what their run exported.
    for weight, average in zip(moving_average.averaged(source), averages()):
      weight.assign(average)
  if carried:
    model.set_weights(source.get_weights())
  else:
    models.backbone(model).set_weights(models.backbone(source).get_weights())
  return (f'{init_from_lib.parts(carried)} from step {step} of the run in '
          f'{url}' + (' (its moving average)' if averages else ''))


def _reader(workdir, source, ema_decay, resolved):
  """A read-only Checkpointer of another run's checkpoints into `source`,
  from the files of the backend it trained on (either format reads on
  either backend); and a function giving its moving average's values
  (None: it kept none)."""
  step = checkpoint_files.Variables('step', shapes=[()], dtype='int32')
  ema = (checkpoint_files.Variables('ema', like=moving_average.averaged(source))
         if ema_decay else None)
  parts = dict(model=source, step=step, **({'ema': ema} if ema else {}))
  files = lambda directory, keep: checkpoint_files.reader(
      backends.trained_on(resolved).checkpoint_format, parts, directory,
      read_only=f'init_from={workdir.url!r} is read, never written')
  checkpointer = Checkpointer(workdir, 1, is_chief=False, files=files)
  return checkpointer, ((lambda: [keras.ops.convert_to_numpy(v)
                                  for v in ema.values]) if ema else None)


#END
