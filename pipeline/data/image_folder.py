"""A folder of class folders as a data set, local or on gs://.

The layout of Keras' `image_dataset_from_directory` and torchvision's
`ImageFolder`: `root/<class name>/**/<image>`. Class indices follow the
sorted folder names, the same on every host and every run. Without an
eval folder, a fixed fraction of each class is held out, chosen by a hash
of the file's path below the root, so it never changes between runs or
hosts and a file added later does not move the others.

Files are listed once (tf.io.gfile, which reads gs:// too), each file is
one record (its bytes, its label, its path), and records are sharded per
host before anything is read; decoding is the common path's (decode.py:
a JPEG's crop window alone, an undecodable file skipped, counted and
named).
"""

import hashlib
import os

import tensorflow as tf

from pipeline.errors import UserError

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
  of a kind TensorFlow does not decode."""
  root = root.rstrip('/')
  try:
    exists = tf.io.gfile.isdir(root)
  except tf.errors.OpError as e:
    raise UserError(f'cannot read the image folder {root!r}: {e.message}') \
        from None
  if not exists:
    raise UserError(f'image folder {root!r} does not exist; it must hold one '
                    f'folder per class of {ACCEPTED}')
  names = sorted(name.rstrip('/') for name in tf.io.gfile.listdir(root)
                 if tf.io.gfile.isdir(os.path.join(root, name.rstrip('/'))))
  if not names:
    raise UserError(f'image folder {root!r} holds no class folders; it must '
                    f'hold one folder per class (e.g. {root}/cat/1.jpg) of '
                    f'{ACCEPTED}')
  files = []
  for label, name in enumerate(names):
    images = _images(os.path.join(root, name))
    if not images:
      raise UserError(f'class folder {os.path.join(root, name)!r} holds no '
                      f'images; put {ACCEPTED} in it, or remove it')
    files.extend((path, label) for path in images)
  return tuple(names), files


def _images(folder):
  """The sorted image files under `folder`, sub-folders included."""
  found = []
  for directory, _, filenames in tf.io.gfile.walk(folder):
    for filename in filenames:
      lower = filename.lower()
      if lower.startswith('.') or lower in IGNORED:
        continue
      path = os.path.join(directory, filename)
      if not lower.endswith(IMAGE_EXTENSIONS):
        raise UserError(f'{path!r} is not an image this pipeline reads; '
                        f'accepted: {ACCEPTED} (hidden files are passed over)')
      found.append(path)
  return sorted(found)


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
  if not 0 < config.eval_fraction < 1:
    raise UserError(f'eval_fraction={config.eval_fraction} must be in (0, 1) '
                    'without an eval_dir')
  root = config.train_dir.rstrip('/')
  parts = {'train': [], 'eval': []}
  for path, label in train:
    parts['eval' if held_out(path, root, config.eval_fraction)
          else 'train'].append((path, label))
  for split, part in parts.items():
    if not part:
      raise UserError(f'eval_fraction={config.eval_fraction} leaves no '
                      f'{split} images among the {len(train)} in '
                      f'{config.train_dir!r}')
  return names, parts


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
  return dataset.map(lambda path, label: (tf.io.read_file(path), label, path),
                     num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=not shuffle or seed is not None
                     ).ignore_errors()


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
