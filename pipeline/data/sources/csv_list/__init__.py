"""A CSV of image paths and labels (names or integers; paths relative to the
CSV or absolute, local or gs://), an eval CSV or a held-out share
(rows.py reads it): a missing file is a record without bytes,
counted and named as undecodable."""

from pipeline import parts
from pipeline.data.sources.source import EVAL_FRACTION
from pipeline.data.sources.source import ListedImages
from pipeline.data.sources.source import NUM_CLASSES


class CsvList(ListedImages):
  """A CSV of image paths and labels."""
  name = 'csv'
  description = ('a CSV of image paths and labels (names or integers; '
                 'local or gs://), an eval CSV or a held-out share')
  keys = {
      'train_csv': parts.Key('csv: the CSV of training image paths and '
                             'labels'),
      'eval_csv': parts.Key('csv: its eval CSV; without it eval_fraction of '
                            'its rows are held out'),
      'eval_fraction': EVAL_FRACTION,
      'num_classes': NUM_CLASSES,
  }
  train_key, eval_key = 'train_csv', 'eval_csv'
  listing = 'a CSV of image paths and labels'

  def listed(self, settings):
    from pipeline.data.sources import listed_files  # pylint: disable=g-import-not-at-top
    from pipeline.data.sources.csv_list import rows as csv_files  # pylint: disable=g-import-not-at-top
    names, files, num_classes = csv_files.splits(settings)
    missing = csv_files.missing(files)
    return names, files, num_classes, (
        lambda split_files, *how: csv_files.read_files(split_files, missing,
                                                       *how)), (
        listed_files.read_head)
