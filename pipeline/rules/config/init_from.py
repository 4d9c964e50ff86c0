"""What `init_from` may name, checked before anything is built (so
--dry_run says so too), and the plan's arithmetic and words for it. Loading
the weights is training/finetune.py's."""

import os
import re

import tensorflow as tf

from pipeline.errors import UserError
from pipeline.rules.config import classes
from pipeline.storage import workdirs

WEIGHTS_FILE = re.compile(r'\.(h5|hdf5|keras)$')


def check_source(config, class_names, staging_dir):
  """For a run that starts now: a one-line UserError if `init_from` names a
  weights file that is not there, a folder that holds no run of this model,
  or a run whose head would be carried but trained other class names (found
  before anything is built, so --dry_run says so too). Returns how the plan
  names the first weights."""
  init_from = config.init_from
  if not init_from or init_from == 'imagenet':
    return describe(init_from)
  if WEIGHTS_FILE.search(init_from):
    if not tf.io.gfile.exists(init_from):
      raise UserError(f'init_from={init_from!r}: no such weights file; '
                      "accepted: imagenet, a .h5 weights file of the model's "
                      'headless network, or the workdir of another run')
    return describe(init_from)
  _, saved = source_run(config, init_from, staging_dir)
  carried = carries_head(config, saved, class_names)
  return describe(init_from, class_names if carried else ())


def carries_head(config, saved, class_names):
  """Whether the run `init_from` names (its run.json `saved`) gives its head
  too: `init_head` is on and both runs know their class names, which must
  then be the same (a one-line UserError if not: its head would answer for
  other classes)."""
  theirs = tuple(saved.get('resolved', {}).get('class_names') or ())
  if not (config.init_head and theirs and class_names):
    return False
  if theirs != tuple(class_names):
    raise UserError(
        f'init_from={config.init_from!r} trained '
        f'{classes.differing(theirs, class_names)}; pass '
        '--config.init_head=False to take its backbone alone with a new head '
        'for these classes, or start from a run of these classes')
  return True


def parts(carried_classes):
  """What a run gives: its backbone, and its head with `carried_classes`."""
  return (f'head (the same {len(carried_classes)} classes) and backbone'
          if carried_classes else 'backbone')


def source_run(config, url, staging_dir):
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


def describe(init_from, carried_classes=()):
  """How the plan names where the first weights come from (a run's head
  too, given the classes it carries)."""
  if not init_from:
    return 'random initial weights'
  if init_from == 'imagenet':
    return "backbone from keras.applications' ImageNet weights"
  if WEIGHTS_FILE.search(init_from):
    return f'backbone from the weights file {init_from}'
  return f'{parts(carried_classes)} from the run in {init_from}'


def frozen_steps(config, steps_per_epoch):
  """Steps that train the head alone."""
  return int(round(config.freeze_backbone_epochs * steps_per_epoch))
