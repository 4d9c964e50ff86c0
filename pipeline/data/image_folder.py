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

import hashlib
import os

from google.api_core import exceptions
import tensorflow as tf

from pipeline.data.sources.source import check_eval_fraction
from pipeline.errors import UserError
from pipeline.storage import gcs

# What TensorFlow's decode_image reads, by extension.
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.gif', '.bmp', '.webp')
ACCEPTED = 'JPEG, PNG, GIF, BMP or WebP files (' + ', '.join(
    IMAGE_EXTENSIONS) + ')'
# What file managers and tools leave beside images: passed over.
IGNORED = ('.ds_store', 'thumbs.db', 'desktop.ini')
LABELS_FILE = 'labels.txt'


def list_classes(root):
  """(class names, [(path, label)]) of the tree under `root`; a one-line
  UserError for a missing or empty tree, an empty class folder, or a file
  of a kind TensorFlow does not decode. Hidden files and folders (a
  notebook's .ipynb_checkpoints) are passed over."""
  root = root.rstrip('/')
  folders, relatives = (_gcs_tree if gcs.is_gcs(root) else _tree)(root)
  names = sorted(name for name in folders if not name.startswith('.'))
  if not names:
    raise UserError(f'image folder {root!r} holds no class folders; it must '
                    f'hold one folder per class (e.g. {root}/cat/1.jpg) of '
                    f'{ACCEPTED}')
  images = {name: [] for name in names}
  for relative in sorted(relatives):
    parts = relative.split('/')
    if len(parts) < 2 or any(part.startswith('.') for part in parts):
      continue  # Beside the class folders, or hidden.
    if parts[-1].lower() in IGNORED:
      continue
    path = f'{root}/{relative}'
    if not parts[-1].lower().endswith(IMAGE_EXTENSIONS):
      raise UserError(f'{path!r} is not an image this pipeline reads; '
                      f'accepted: {ACCEPTED} (hidden files are passed over)')
    images[parts[0]].append(path)
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


def held_out(path, root, fraction):
  """Whether `path` is in the held-out eval fraction: a hash of its path
  below `root`, so the same on every host, run and machine."""
  relative = os.path.relpath(path, root).encode()
  bucket = int.from_bytes(hashlib.sha256(relative).digest()[:8], 'big')
  return bucket / 2.0**64 < fraction


def splits(config):
  """(class names, {'train': files, 'eval': files}), files [(path, label)]."""
  names, train = list_classes(config.train_dir)
  if config.eval_dir:
    eval_names, evaluated = list_classes(config.eval_dir)
    if eval_names != names:
      raise UserError(f'eval_dir {config.eval_dir!r} has the classes '
                      f'{", ".join(eval_names)}, train_dir '
                      f'{config.train_dir!r} has {", ".join(names)}; both '
                      'must hold the same class folders')
    return names, {'train': train, 'eval': evaluated}
  return names, hold_out(train, config.train_dir.rstrip('/'),
                         config.eval_fraction, f'images in {config.train_dir!r}')


def hold_out(files, root, fraction, listed):
  """{'train': files, 'eval': files} of `files` [(path, label)]: a
  `fraction` of them held out by a hash of each path below `root`
  (held_out). A one-line UserError where the fraction is no share or
  leaves a split empty; `listed` says what the files are, for it."""
  check_eval_fraction(fraction)
  parts = {'train': [], 'eval': []}
  for path, label in files:
    parts['eval' if held_out(path, root, fraction) else 'train'].append(
        (path, label))
  for split, part in parts.items():
    if not part:
      raise UserError(f'eval_fraction={fraction} leaves no {split} '
                      f'{listed} among the {len(files)}; change it, or give '
                      'an eval split')
  return parts


def read_files(files, input_context, shuffle, seed):
  """(bytes, label, path) records of this pipeline's share of `files`,
  sharded before anything is read. A file gone since it was listed is
  passed over; one that does not decode is skipped, counted and named later."""
  paths, labels = zip(*files)
  dataset = tf.data.Dataset.from_tensor_slices(
      (list(paths), list(labels))).shard(
          input_context.num_input_pipelines, input_context.input_pipeline_id)
  if shuffle:
    dataset = dataset.shuffle(len(paths), seed=seed,
                              reshuffle_each_iteration=True)
  read = _reader(paths)
  return dataset.map(lambda path, label: (read(path), label, path),
                     num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=not shuffle or seed is not None
                     ).ignore_errors()


def _reader(paths):
  """What reads a file in tf.data: TensorFlow's own reader, local or gs://;
  on gs:// with STORAGE_EMULATOR_HOST set, the google-cloud-storage client,
  as TensorFlow's gs:// cannot reach an emulator."""
  if not (gcs.emulated() and gcs.is_gcs(paths[0])):
    return tf.io.read_file
  return lambda path: tf.ensure_shape(tf.numpy_function(
      lambda name: read_bytes(name.decode()), [path], tf.string,
      stateful=False), [])


def read_bytes(path):
  """A file's bytes, by the same rule as _reader."""
  if gcs.is_gcs(path) and gcs.emulated():
    return gcs.read_object(path)
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read()


def write_labels(folder, names):
  """The class names beside TFRecord files, one per line in index order."""
  with tf.io.gfile.GFile(os.path.join(folder, LABELS_FILE), 'w') as f:
    f.write(''.join(f'{name}\n' for name in names))


def read_labels(pattern):
  """The class names in the labels file beside files matching `pattern`;
  () where there is none."""
  path = os.path.join(os.path.dirname(pattern), LABELS_FILE)
  if not tf.io.gfile.exists(path):
    return ()
  with tf.io.gfile.GFile(path) as f:
    return tuple(line.rstrip('\n') for line in f if line.strip())
