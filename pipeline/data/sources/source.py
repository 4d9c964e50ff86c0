"""What every source is: a DataSource (what a run asks of it) that loads a
Source (its records and counts); the keys several sources share."""

import dataclasses
from typing import Callable

from pipeline import parts
from pipeline.data.sources import detail as detail_lib
from pipeline.errors import UserError


# The config key that names a source (its settings carry it too).
SOURCE_KEY = 'dataset'


class UnknownSet(LookupError):
  """config.dataset names no source and no tensorflow-datasets set."""


class DataSource(parts.Part):
  """What a run asks of one source; each method is given the source's
  parts.Settings (its own keys, and config.dataset), never the config."""
  # Its class names are the user's (folders, labels.txt): the plan shows them.
  names_classes = False

  def inputs(self, settings):
    """{config key: path} of what the input workers read ('' a default)."""
    raise NotImplementedError

  def held_out(self, settings):
    """The name of the split evaluation reads."""
    del settings
    return 'held-out'

  def load(self, settings, prepare=True):
    """The Source `settings` name; a one-line UserError if it cannot be
    read. Not `prepare` (a dry run): nothing is downloaded or written; a
    set that needs that first is described as far as it can be
    (Source.counted False)."""
    raise NotImplementedError

  def own_augment(self, settings):
    """(the augmentation its images take where config.augment is left
    open, why): photographs may be mirrored, so a random resized crop
    and a flip; a source of digits or text says otherwise."""
    return 'inception', (f'{settings[SOURCE_KEY]} holds photographs, which '
                         'may be mirrored')


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
  # {'train': files, 'eval': files} where its records are TFRecord files
  # (DALI and the reference input read them); {} where they are not.
  record_files: dict = dataclasses.field(default_factory=dict)
  # What its stored labels count from: the parsed labels are less by it.
  label_offset: int = 0
  # The longer side of every image where the source fixes it (a
  # tensorflow-datasets set's image shape); 0 where they vary.
  image_side: int = 0
  # () -> detail.Detail: how much detail its images hold (their median
  # shorter side), read from a sample when a run's size is left open.
  detail: Callable[[], detail_lib.Detail] = lambda: detail_lib.UNKNOWN
  # Its example counts are known: False for a tensorflow-datasets set a
  # dry run found unprepared (its sizes are known once it is).
  counted: bool = True

  def all_record_files(self):
    """Both splits' record files (where an undecodable record is looked
    for)."""
    return tuple(self.record_files.get('train', ()) +
                 self.record_files.get('eval', ()))

  def class_name(self, index):
    return self.class_names[index] if self.class_names else str(index)


# The classes a source has, where its files do not say: a key of several.
NUM_CLASSES = parts.Key('tfrecord: needed; image_folder, csv: 0 counts '
                        'their classes (or must agree with them)')
# The share of a folder's or a CSV's images held out, where no other split
# is given: a key of both.
EVAL_FRACTION = parts.Key('without an eval folder or CSV, this share of '
                          'the images (by a hash of the path) is held out')


def check_eval_fraction(fraction):
  """A one-line UserError where eval_fraction is no share to hold out."""
  if not 0 < fraction < 1:
    raise UserError(f'eval_fraction={fraction} must be in (0, 1): the share '
                    'held out for evaluation')


class ListedImages(DataSource):
  """Images listed one by one with their labels (a folder of class
  folders, a CSV): read as files, an eval listing or a held-out share.
  `train_key` and `eval_key` name the listings; `listing` says what the
  training one is; `listed(settings)` lists them."""
  train_key = eval_key = listing = ''
  names_classes = True

  def check(self, settings):
    check_eval_fraction(settings.eval_fraction)

  def inputs(self, settings):
    return {key: settings[key] for key in (self.train_key, self.eval_key)
            if key == self.train_key or settings[key]}

  def listed(self, settings):
    """(class names, {'train': files, 'eval': files} of (path, label),
    the class count, a function reading files as read_files does, one
    reading a file's first bytes as read_head does)."""
    raise NotImplementedError

  def load(self, settings, prepare=True):
    del prepare  # Files are read where they are.
    if not settings[self.train_key]:
      raise UserError(f'dataset={self.name} needs --config.{self.train_key}'
                      f'=PATH, {self.listing} (local or gs://)')
    names, files, num_classes, read_files, read_head = self.listed(settings)
    if names and settings.num_classes not in (0, len(names)):
      raise UserError(f'num_classes={settings.num_classes}, but '
                      f'{settings[self.train_key]!r} names {len(names)} '
                      f'classes; leave num_classes at 0 for {self.name}')

    def read(split, input_context, shuffle, seed):
      return read_files(files[split], input_context, shuffle, seed)

    def detail():
      return detail_lib.of_files([path for path, _ in files['train']],
                                 read_head, 'training images')

    return Source(self.name, num_classes, len(files['train']),
                  len(files['eval']), read,
                  parse=lambda encoded, label, path: (encoded, label, path),
                  class_names=names, detail=detail)
