"""Where examples come from: each source one package here, registered in
SOURCES by the value of config.dataset that names it.

tfds_set/ (any tensorflow-datasets image classification set: the fallback
for a name no other source takes; the bundled sklearn_digits), tfrecord/
(TFRecord files: their format, and the bundled photographs), image_folder/
(a folder of class folders) and csv_list/ (a CSV of image paths and
labels); source.py, listed_files.py and detail.py (how much detail a
sample of the images holds) what they share. Each package's
__init__ declares the source, its other modules read it. Each says what a run asks of it (its config keys and checks, the
files its workers read, the split evaluation reads, whether DALI can read
it, whether its class names are the user's) and loads itself into a
Source: a stream of (encoded image, label, origin) records, read per
worker, each worker its own files (or, with fewer files than workers, its
own examples). Decoding is decode.py's, after sharding, so a worker never
pays to decode another's examples.

A new source is a package here and its registration line below. No other module
compares config.dataset with a name. This package imports no TensorFlow
(a source loads it when it loads): configs/default.py reads its keys, and
DALI's choice reads it on the JAX path.
"""

from pipeline import parts
from pipeline.data.sources import csv_list
from pipeline.data.sources import image_folder
from pipeline.data.sources import tfds_set
from pipeline.data.sources import tfrecord
from pipeline.data.sources.source import DataSource  # pylint: disable=unused-import
from pipeline.data.sources.source import ListedImages  # pylint: disable=unused-import
from pipeline.data.sources.source import Source  # pylint: disable=unused-import
from pipeline.data.sources.source import UnknownSet
from pipeline.errors import UserError

SOURCES = parts.Table(
    'source', 'dataset',
    accepted='or a tensorflow-datasets image classification name, e.g. '
    'sklearn_digits (offline), cifar10, imagenet2012')
# The order is the docs' (configs-and-data.md) and the errors'.
SOURCES.register(tfrecord.TFRecordFiles())
SOURCES.register(image_folder.ClassFolders())
SOURCES.register(csv_list.CsvList())
SOURCES.register(tfds_set.TfdsSet(), fallback=True)


def load_source(config, prepare=True):
  """The Source `config.dataset` names; not `prepare` (a dry run): a set
  that must be downloaded or prepared first is described, not prepared."""
  try:
    return SOURCES.of(config).load(SOURCES.settings(config), prepare)
  except UnknownSet:
    raise UserError(f'unknown dataset {config.dataset!r}; accepted: '
                    f'{SOURCES.listed()}') from None


def inputs(config):
  """{config key: path} of what the input workers read."""
  return SOURCES.of(config).inputs(SOURCES.settings(config))
