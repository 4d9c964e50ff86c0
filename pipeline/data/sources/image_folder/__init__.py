"""A folder of class folders (root/class/image, local or gs://), listed once;
a held-out share of each class by a hash of the path, or an eval folder
(tree.py lists them, listed_files.py reads them)."""

from pipeline import parts
from pipeline.data.sources.source import EVAL_FRACTION
from pipeline.data.sources.source import ListedImages
from pipeline.data.sources.source import NUM_CLASSES


class ClassFolders(ListedImages):
  """A folder of class folders."""
  name = 'image_folder'
  description = ('a folder of class folders (root/class/image.jpg, local or '
                 'gs://), an eval folder or a held-out share')
  keys = {
      'train_dir': parts.Key('image_folder: the folder of class folders'),
      'eval_dir': parts.Key('image_folder: its eval folder; without it '
                            'eval_fraction of each class is held out'),
      'eval_fraction': EVAL_FRACTION,
      'num_classes': NUM_CLASSES,
  }
  train_key, eval_key = 'train_dir', 'eval_dir'
  listing = 'a folder of class folders'

  def listed(self, settings):
    from pipeline.data.sources import listed_files  # pylint: disable=g-import-not-at-top
    from pipeline.data.sources.image_folder import tree  # pylint: disable=g-import-not-at-top
    names, files = tree.splits(settings)
    return (names, files, len(names), listed_files.read_files,
            listed_files.read_head)
