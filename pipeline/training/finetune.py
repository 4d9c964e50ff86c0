"""Fine-tuning: a new run's backbone from published or earlier weights.

`init_from` names where the backbone's first weights come from:
  imagenet     keras.applications' published ImageNet weights of the model,
               downloaded by Keras once (into ~/.keras/models);
  a file       local or gs://: weights of the same headless network, such as
               Keras' own efficientnetb0_notop.h5 fetched by hand;
  a workdir    another run of launch.train (local or gs://): its newest
               committed checkpoint, its moving average if it kept one;
               trained on either backend, read on either.
The head is always new: this run's classes. Only a run that starts at step
0 loads them; a resumed run restores its own checkpoint instead.

With `freeze_backbone_epochs`, the backbone is frozen for that long (batch
norm in inference mode) while the new head learns, then the whole model
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
from pipeline.run import validation
from pipeline.storage import checkpoint_files
from pipeline.storage import workdirs
from pipeline.storage.checkpoint import Checkpointer
from pipeline.training import models
from pipeline.training import moving_average

_WEIGHTS_FILE = re.compile(r'\.(h5|hdf5|keras)$')


def check_source(config, staging_dir):
  """For a run that starts now: a one-line UserError if `init_from` names a
  weights file that is not there, or a folder that holds no run of this
  model (found before anything is built, so --dry_run says so too)."""
  init_from = config.init_from
  if not init_from or init_from == 'imagenet':
    return
  if _WEIGHTS_FILE.search(init_from):
    if not tf.io.gfile.exists(init_from):
      raise UserError(f'init_from={init_from!r}: no such weights file; '
                      "accepted: imagenet, a .h5 weights file of the model's "
                      'headless network, or the workdir of another run')
    return
  _source_run(config, init_from, staging_dir)


def _source_run(config, url, staging_dir):
  """(Workdir, run.json) of the run `init_from` names, checked."""
  workdir = workdirs.Workdir(url, os.path.join(staging_dir, 'init_from'))
  saved = workdir.read_json('run.json')
  if not saved:
    raise UserError(f'init_from={url!r} is not imagenet, a .h5 weights file '
                    'or the workdir of a run (it has no run.json)')
  theirs = saved['config']['model']
  if theirs != config.model:
    raise UserError(f'init_from={url!r} trained {theirs}, not '
                    f'{config.model}; set --config.model={theirs} or start '
                    'from another run')
  return workdir, saved


def describe(init_from):
  """How the plan names where the first weights come from."""
  if not init_from:
    return 'random initial weights'
  if init_from == 'imagenet':
    return "backbone from keras.applications' ImageNet weights"
  if _WEIGHTS_FILE.search(init_from):
    return f'backbone from the weights file {init_from}'
  return f'backbone from the run in {init_from}'


def load_backbone(config, model, staging_dir):
  """Loads `config.init_from` into `model`'s backbone; returns what it did."""
  init_from = config.init_from
  target = models.backbone(model)
  if init_from == 'imagenet':
    source = _published(config)
  elif _WEIGHTS_FILE.search(init_from):
    source = _from_file(config, init_from)
  else:
    return _from_run(config, init_from, target, staging_dir)
  target.set_weights(source.get_weights())
  return describe(init_from)


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
  check_source(config, '')
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


def _from_run(config, url, target, staging_dir):
  """The backbone of another run's newest committed checkpoint."""
  workdir, saved = _source_run(config, url, staging_dir)
  theirs = validation.complete(saved['config'], source=f'{url}/run.json')
  # Their head (their classes) is restored and dropped; only the backbone
  # is copied, at any image size (no weight depends on it).
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
  target.set_weights(models.backbone(source).get_weights())
  return (f'backbone from step {step} of the run in {url}'
          + (' (its moving average)' if averages else ''))


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


def frozen_steps(config, steps_per_epoch):
  """Steps that train the head alone."""
  return int(round(config.freeze_backbone_epochs * steps_per_epoch))

