"""A folder of class folders as a data set, local or on gs://.

The layout of Keras' `image_dataset_from_directory` and torchvision's
`ImageFolder`: `root/<class name>/**/<image>`. Class indices follow the
sorted folder names, the same on every host and every run. Without an
eval folder, a fixed fraction of each class is held out, chosen by a hash
of the file's path below the root, so it never changes between runs or
hosts and a file added later does not move the others.

Files are listed once (tf.io.gfile; on gs:// one listing of the bucket
through google-cloud-storage, which also reaches an emulator), each file is
one record (its bytes, its label, its path), and records are sharded per
host before anything is read; decoding is the common path's (decode.py:
a JPEG's crop window alone, an undecodable file skipped, counted and
named).
"""

import os

from absl import logging
from google.api_core import exceptions
import tensorflow as tf

from pipeline.data.sources import listed_files
from pipeline.errors import UserError
from pipeline.storage import gcs

# What TensorFlow's decode_image reads, by extension.
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.gif', '.bmp', '.webp')
ACCEPTED = 'JPEG, PNG, GIF, BMP or WebP files (' + ', '.join(
    IMAGE_EXTENSIONS) + ')'
def list_classes(root):
  """(class names, [(path, label)]) of the tree under `root`; a one-line
  UserError for a missing or empty tree or an empty class folder. Files
  that are not images by their names (notes, Thumbs.db, hidden files, a
  notebook's .ipynb_checkpoints) are passed over, as Keras'
  image_dataset_from_directory passes them, and counted in one line; a
  file with an image's name that does not decode is skipped and counted
  when it is read."""
  root = root.rstrip('/')
  folders, relatives = (_gcs_tree if gcs.is_gcs(root) else _tree)(root)
  names = sorted(name for name in folders if not name.startswith('.'))
  if not names:
    raise UserError(f'image folder {root!r} holds no class folders; it must '
                    f'hold one folder per class (e.g. {root}/cat/1.jpg) of '
                    f'{ACCEPTED}')
  images = {name: [] for name in names}
  passed_over = []
  for relative in sorted(relatives):
    parts = relative.split('/')
    if len(parts) < 2:
      continue  # Beside the class folders.
    path = f'{root}/{relative}'
    if (any(part.startswith('.') for part in parts) or
        not parts[-1].lower().endswith(IMAGE_EXTENSIONS)):
      passed_over.append(path)
      continue
    images[parts[0]].append(path)
  if passed_over:
    logging.info('Passed over %d file(s) in %s that are not %s, e.g. %s',
                 len(passed_over), root, ACCEPTED, passed_over[0])
  files = []
  for label, name in enumerate(names):
    if not images[name]:
      folder = f'{root}/{name}'
      raise UserError(f'class folder {folder!r} holds no images; put '
                      f'{ACCEPTED} in it, or remove it')
    files.extend((path, label) for path in images[name])
  return tuple(names), files


def _tree(root):
  """(top folder names, file paths relative to `root`) of a local tree,
  or one on any file system tf.io.gfile reads."""
  try:
    exists = tf.io.gfile.isdir(root)
  except tf.errors.OpError as e:
    raise UserError(f'cannot read the image folder {root!r}: {e.message}') \
        from None
  if not exists:
    raise UserError(f'image folder {root!r} does not exist; it must hold one '
                    f'folder per class of {ACCEPTED}')
  folders = [name.rstrip('/') for name in tf.io.gfile.listdir(root)
             if tf.io.gfile.isdir(f'{root}/{name.rstrip("/")}')]
  relatives = [os.path.relpath(os.path.join(directory, filename), root)
               for directory, _, filenames in tf.io.gfile.walk(root)
               for filename in filenames]
  return folders, relatives


def _gcs_tree(root):
  """The same from one listing of the bucket: GCS has no folders, only
  names with slashes (and the empty `name/` objects consoles make)."""
  location = gcs.Location(root)
  try:
    names = location.list()
  except exceptions.NotFound:
    raise UserError(f'bucket {location.bucket_name!r} does not exist (image '
                    f'folder {root})') from None
  if not names:
    raise UserError(f'image folder {root!r} does not exist; it must hold one '
                    f'folder per class of {ACCEPTED}')
  folders = {name.split('/')[0] for name in names if '/' in name}
  return folders, [name for name in names if not name.endswith('/')]


def splits(settings):
  """(class names, {'train': files, 'eval': files}), files [(path, label)]."""
  names, train = list_classes(settings.train_dir)
  if settings.eval_dir:
    eval_names, evaluated = list_classes(settings.eval_dir)
    if eval_names != names:
      raise UserError(f'eval_dir {settings.eval_dir!r} has the classes '
                      f'{", ".join(eval_names)}, train_dir '
                      f'{settings.train_dir!r} has {", ".join(names)}; both '
                      'must hold the same class folders')
    return names, {'train': train, 'eval': evaluated}
  return names, listed_files.hold_out(
      train, settings.train_dir.rstrip('/'), settings.eval_fraction,
      f'images in {settings.train_dir!r}')
