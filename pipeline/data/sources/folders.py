"""A folder of class folders (root/class/image, local or gs://), listed once;
a held-out share of each class by a hash of the path, or an eval folder
(data/image_folder.py reads them)."""

from pipeline import parts
from pipeline.data.sources.source import DataSource
from pipeline.data.sources.source import EVAL_FRACTION
from pipeline.data.sources.source import NUM_CLASSES
from pipeline.data.sources.source import Source
from pipeline.data.sources.source import check_eval_fraction
from pipeline.errors import UserError


class ClassFolders(DataSource):
  """A folder of class folders."""
  name = 'image_folder'
  description = ('a folder of class folders (root/class/image.jpg, local or '
                 'gs://), an eval folder or a held-out share')
  keys = {
      'train_dir': parts.Key('', 'image_folder: the folder of class folders'),
      'eval_dir': parts.Key('', 'image_folder: its eval folder; without it '
                            'eval_fraction of each class is held out'),
      'eval_fraction': EVAL_FRACTION,
      'num_classes': NUM_CLASSES,
  }
  names_classes = True

  def check(self, config):
    check_eval_fraction(config)

  def inputs(self, config):
    return {'train_dir': config.train_dir,
            **({'eval_dir': config.eval_dir} if config.eval_dir else {})}

  def load(self, config):
    from pipeline.data import image_folder  # pylint: disable=g-import-not-at-top
    if not config.train_dir:
      raise UserError('dataset=image_folder needs --config.train_dir=PATH, a '
                      'folder of class folders (local or gs://)')
    names, files = image_folder.splits(config)
    if config.num_classes and config.num_classes != len(names):
      raise UserError(f'num_classes={config.num_classes}, but '
                      f'{config.train_dir!r} holds {len(names)} class '
                      'folders; leave num_classes at 0 for image_folder')

    def read(split, input_context, shuffle, seed):
      return image_folder.read_files(files[split], input_context, shuffle,
                                     seed)

    return Source('image_folder', len(names), len(files['train']),
                  len(files['eval']), read,
                  parse=lambda encoded, label, path: (encoded, label, path),
                  class_names=names)

