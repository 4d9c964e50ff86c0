"""What every source is: a DataSource (what a run asks of it) that loads a
Source (its records and counts); the keys several sources share."""

import dataclasses
from typing import Callable

from pipeline import parts
from pipeline.errors import UserError


class UnknownSet(LookupError):
  """config.dataset names no source and no tensorflow-datasets set."""


class DataSource(parts.Part):
  """What a run asks of one source."""
  # Its files are TFRecords: DALI and the reference input can read them.
  record_files = False
  # Its class names are the user's (folders, labels.txt): the plan shows them.
  names_classes = False

  def inputs(self, config):
    """{config key: path} of what the input workers read ('' a default)."""
    raise NotImplementedError

  def held_out(self, config):
    """The name of the split evaluation reads."""
    return config.eval_split or 'held-out'

  def load(self, config):
    """The Source `config` names; a one-line UserError if it cannot be
    read."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Source:
  """A loaded source: where the examples come from, and how many there are."""
  name: str
  num_classes: int
  num_train_examples: int
  num_eval_examples: int
  # read(split, input_context, shuffle, seed) -> records of this pipeline.
  read: Callable[..., object]
  # parse(*record) -> (encoded image, label, origin); may fail for bad data.
  parse: Callable[..., tuple]
  class_names: tuple = ()  # Index -> name; () where the source has none.
  encoded_bytes: int = 0  # Both splits' records as stored; 0: unknown.

  def class_name(self, index):
    return self.class_names[index] if self.class_names else str(index)


# The classes a source has, where its files do not say: a key of several.
NUM_CLASSES = parts.Key(0, 'tfrecord: needed; image_folder, csv: 0 counts '
                        'their classes (or must agree with them)')
# The share of a folder's or a CSV's images held out, where no other split
# is given: a key of both.
EVAL_FRACTION = parts.Key(0.1, 'without an eval folder or CSV, this share '
                          'of the images (by a hash of the path) is held out')


def check_eval_fraction(config):
  """A one-line UserError where eval_fraction is no share to hold out."""
  if not 0 < config.eval_fraction < 1:
    raise UserError(f'eval_fraction={config.eval_fraction} must be in (0, 1): '
                    'the share held out for evaluation')
