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

Everything of it is here: what it takes of the config (FineTuning, the
plan's `fine_tuning`), what init_from may name, checked before anything is
built (so --dry_run says so too), the plan's words for it, and loading the
weights, which the model's family (recipe/models/) builds and names and
the checkpoint formats (storage/checkpoint_files.py) read.
"""

import dataclasses
import enum
import os
import re
import tempfile

import keras
import tensorflow as tf

from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.recipe import models
from pipeline.recipe import moving_average
from pipeline.rules.config import classes
from pipeline.rules.config import validation
from pipeline.storage import checkpoint_files
from pipeline.storage import checkpoint_format
from pipeline.storage import workdirs
from pipeline.storage.checkpoint import Checkpointer

WEIGHTS_FILE = re.compile(r'\.(h5|hdf5|keras)$')


class Start(enum.Enum):
  """What init_from names."""
  RANDOM = 'random initial weights'  # init_from=''.
  PUBLISHED = 'imagenet'  # keras.applications' ImageNet weights.
  WEIGHTS_FILE = 'a weights file'  # .h5, .hdf5 or .keras, local or gs://.
  RUN = 'a run'  # Another run's workdir.

  @classmethod
  def of(cls, init_from):
    if not init_from:
      return cls.RANDOM
    if init_from == cls.PUBLISHED.value:
      return cls.PUBLISHED
    return cls.WEIGHTS_FILE if WEIGHTS_FILE.search(init_from) else cls.RUN


@dataclasses.dataclass(frozen=True)
class FineTuning:
  """What fine-tuning takes of a run's config, read once: the network
  (its name and input size) and where its first weights come from."""
  model: str
  image_size: int
  init_from: str  # '' (random), 'imagenet', a weights file, a workdir.
  start: Start  # What init_from names, classified once.
  init_head: bool  # A run's head too, where it trained these classes.
  freeze_backbone_epochs: float

  @classmethod
  def of(cls, config, image_size=None):
    """`image_size`: the run's resolved training size (None: the
    config's, which must then be given)."""
    return cls(config.model, image_size or config.image_size,
               config.init_from,
               Start.of(config.init_from), config.init_head,
               config.freeze_backbone_epochs)


def load_init_from(tuning, model, class_names, staging_dir):
  """Loads `tuning.init_from` into `model` (these data's `class_names`):
  its backbone, and a run's head where carries_head says so.
  Returns what it did."""
  init_from, start = tuning.init_from, tuning.start
  if start is Start.RUN:
    return _from_run(tuning, init_from, model, class_names, staging_dir)
  source = (_published(tuning) if start is Start.PUBLISHED else
            _from_file(tuning, init_from))
  # Keras' ImageNet weights, downloaded or fetched by hand under their name.
  published = (start is Start.PUBLISHED or
               os.path.basename(init_from) == _published_name(tuning.model))
  models.MODELS[tuning.model].load(tuning.model, models.backbone(model),
                                   source, published)
  return describe(tuning)


def headless(tuning, weights):
  """The run's network, headless, with `weights` (its family's)."""
  return models.MODELS[tuning.model].headless(
      tuning.model, weights, (tuning.image_size, tuning.image_size, 3))


def _published(tuning):
  family = models.MODELS[tuning.model]
  family.published_file(tuning.model)  # One line where there are none.
  try:
    return headless(tuning, 'imagenet')
  except Exception as e:  # pylint: disable=broad-except
    # Keras raises a bare Exception for a failed download.
    url = re.search(r'https?://\S+?\.h5', str(e))
    where = url.group(0) if url else "Keras' published weights"
    raise UserError(
        f"init_from=imagenet: downloading {tuning.model}'s ImageNet weights "
        f'failed ({first_line(e)}); without network, fetch {where} '
        'elsewhere and pass its path as --config.init_from=PATH') from None


def published_file(model):
  """The name Keras gives `model`'s published headless ImageNet weights."""
  return models.MODELS[model].published_file(model)


def _published_name(model):
  """published_file's, or '' for a network without published weights."""
  try:
    return published_file(model)
  except UserError:
    return ''


def _from_file(tuning, path):
  check_source(tuning, (), '')
  with tempfile.TemporaryDirectory() as folder:
    local = path
    if '://' in path:  # h5py reads local files only.
      local = os.path.join(folder, os.path.basename(path))
      tf.io.gfile.copy(path, local)
    try:
      return headless(tuning, local)
    except (ValueError, OSError) as e:
      example = _published_name(tuning.model)
      raise UserError(f'init_from={path!r} does not load into the headless '
                      f'{tuning.model} ({first_line(e)}); pass weights of '
                      'that network' + (f", e.g. Keras' {example}" if example
                                        else '')) from None


def _from_run(tuning, url, model, class_names, staging_dir):
  """Another run's newest committed checkpoint: its backbone, and its head
  if it trained these classes and init_head is on."""
  workdir, saved = source_run(tuning, url, staging_dir)
  carried = class_names if carries_head(tuning, saved, class_names) else ()
  theirs = validation.complete(saved['config'], source=f'{url}/run.json')
  # Restored whole, at any image size (no weight depends on it); a head of
  # other classes is dropped.
  source = models.build_model(theirs.model,
                              saved['resolved']['num_classes'],
                              tuning.image_size)
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
    models.MODELS[tuning.model].load(tuning.model, models.backbone(model),
                                     models.backbone(source), False)
  return (f'{parts(carried)} from step {step} of the run in '
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
  written_as = _format_of(workdir, resolved)  # Before anything is read.
  files = lambda directory, keep: checkpoint_files.reader(
      written_as, parts, directory,
      read_only=f'init_from={workdir.url!r} is read, never written')
  checkpointer = Checkpointer(workdir, 1, is_chief=False, files=files)
  return checkpointer, ((lambda: [keras.ops.convert_to_numpy(v)
                                  for v in ema.values]) if ema else None)


def _format_of(workdir, resolved):
  try:
    return checkpoint_format.of_run(resolved)
  except ValueError as e:
    raise UserError(f'init_from={workdir.url!r}: its run.json: {e}') from None


# --- What init_from may name, and the plan's words for it ---------------


def check_source(tuning, class_names, staging_dir):
  """For a run that starts now: a one-line UserError if `init_from` names a
  weights file that is not there, a folder that holds no run of this model,
  or a run whose head would be carried but trained other class names (found
  before anything is built, so --dry_run says so too). Returns how the plan
  names the first weights."""
  init_from = tuning.init_from
  if tuning.start is Start.WEIGHTS_FILE and not tf.io.gfile.exists(init_from):
    raise UserError(f'init_from={init_from!r}: no such weights file; '
                    "accepted: imagenet, a .h5 weights file of the model's "
                    'headless network, or the workdir of another run')
  if tuning.start is not Start.RUN:
    return describe(tuning)
  _, saved = source_run(tuning, init_from, staging_dir)
  carried = carries_head(tuning, saved, class_names)
  return describe(tuning, class_names if carried else ())


def carries_head(tuning, saved, class_names):
  """Whether the run `init_from` names (its run.json `saved`) gives its head
  too: `init_head` is on and both runs know their class names, which must
  then be the same (a one-line UserError if not: its head would answer for
  other classes)."""
  theirs = tuple(saved.get('resolved', {}).get('class_names') or ())
  if not (tuning.init_head and theirs and class_names):
    return False
  if theirs != tuple(class_names):
    raise UserError(
        f'init_from={tuning.init_from!r} trained '
        f'{classes.differing(theirs, class_names)}; pass '
        '--config.init_head=False to take its backbone alone with a new head '
        'for these classes, or start from a run of these classes')
  return True


def parts(carried_classes):
  """What a run gives: its backbone, and its head with `carried_classes`."""
  return (f'head (the same {len(carried_classes)} classes) and backbone'
          if carried_classes else 'backbone')


def source_run(tuning, url, staging_dir):
  """(Workdir, run.json) of the run `init_from` names, checked."""
  workdir = workdirs.Workdir(url, os.path.join(staging_dir, 'init_from'))
  saved = workdir.read_json(workdirs.File.RUN)
  if not saved:
    raise UserError(f'init_from={url!r} is not imagenet, a .h5 weights file '
                    'or the workdir of a run (it has no run.json)')
  theirs = saved['config']['model']
  if theirs != tuning.model:
    raise UserError(f'init_from={url!r} trained {theirs}, not '
                    f'{tuning.model}; set --config.model={theirs} or start '
                    'from another run')
  return workdir, saved


def describe(tuning, carried_classes=()):
  """How the plan names where the first weights come from (a run's head
  too, given the classes it carries)."""
  return {
      Start.RANDOM: Start.RANDOM.value,
      Start.PUBLISHED: "backbone from keras.applications' ImageNet weights",
      Start.WEIGHTS_FILE: f'backbone from the weights file {tuning.init_from}',
      Start.RUN: f'{parts(carried_classes)} from the run in '
                 f'{tuning.init_from}',
  }[tuning.start]


def frozen_steps(tuning, steps_per_epoch):
  """Steps that train the head alone."""
  return int(round(tuning.freeze_backbone_epochs * steps_per_epoch))
