"""A CSV of image paths and labels (names or integers; paths relative to the
CSV or absolute, local or gs://), an eval CSV or a held-out share
(data/csv_files.py reads it): a missing file is a record without bytes,
counted and named as undecodable."""

from pipeline import parts
from pipeline.data.sources.source import DataSource
from pipeline.data.sources.source import EVAL_FRACTION
from pipeline.data.sources.source import NUM_CLASSES
from pipeline.data.sources.source import Source
from pipeline.data.sources.source import check_eval_fraction
from pipeline.errors import UserError


class CsvList(DataSource):
  """A CSV of image paths and labels."""
  name = 'csv'
  description = ('a CSV of image paths and labels (names or integers; '
                 'local or gs://), an eval CSV or a held-out share')
  keys = {
      'train_csv': parts.Key('', 'csv: the CSV of training image paths and '
                             'labels'),
      'eval_csv': parts.Key('', 'csv: its eval CSV; without it '
                            'eval_fraction of its rows are held out'),
      'eval_fraction': EVAL_FRACTION,
      'num_classes': NUM_CLASSES,
  }
  names_classes = True

  def check(self, config):
    check_eval_fraction(config)

  def inputs(self, config):
    return {'train_csv': config.train_csv,
            **({'eval_csv': config.eval_csv} if config.eval_csv else {})}

  def load(self, config):
    from pipeline.data import csv_files  # pylint: disable=g-import-not-at-top
    if not config.train_csv:
      raise UserError('dataset=csv needs --config.train_csv=PATH, a CSV of '
                      'image paths and labels (local or gs://)')
    names, files, num_classes = csv_files.splits(config)
    if names and config.num_classes not in (0, len(names)):
      raise UserError(f'num_classes={config.num_classes}, but the CSV names '
                      f'{len(names)} classes; leave num_classes at 0 for them')
    missing = csv_files.missing(files)

    def read(split, input_context, shuffle, seed):
      return csv_files.read_files(files[split], missing, input_context,
                                  shuffle, seed)

    return Source('csv', num_classes, len(files['train']), len(files['eval']),
                  read,
                  parse=lambda encoded, label, path: (encoded, label, path),
                  class_names=names)

