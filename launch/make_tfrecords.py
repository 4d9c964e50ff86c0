"""Write a tensorflow-datasets split as TFRecord files in the TPU layout.

  python -m launch.make_tfrecords --output_dir=/tmp/digits_tfrecords
  python -m launch.train --config.dataset=tfrecord \
      --config.train_files='/tmp/digits_tfrecords/train-*' \
      --config.eval_files='/tmp/digits_tfrecords/eval-*' --config.num_classes=10

Useful to feed TPU Nodes (which read only gs://) and for the input benchmark:
--dataset=photos writes colour photographs of ImageNet-like size instead
(pipeline/data/sources/tfrecord/photos.py; --num_examples of them, a tenth as many for eval).

  python -m launch.make_tfrecords --dataset=photos --output_dir=/tmp/photos

--from_dir=PATH writes a folder of class folders (the layout
--config.dataset=image_folder trains from, local or gs://) with the same
train/eval split (--eval_dir, --eval_fraction), the files' bytes as they
are, and the class names in labels.txt beside them, which the tfrecord
source reads back:

  python -m launch.make_tfrecords --from_dir=gs://b/images --output_dir=gs://b/records
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
import ml_collections
import tensorflow as tf

from configs import default
from pipeline.data.sources import listed_files
from pipeline.data.sources.image_folder import tree as image_folder
from pipeline.data.sources.tfrecord import photos
from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.errors import UserError

_DATASET = flags.DEFINE_string(
    'dataset', 'sklearn_digits', "tfds name, or 'photos' (pipeline/data/sources/tfrecord/photos.py).")
_NUM_EXAMPLES = flags.DEFINE_integer(
    'num_examples', 2000, "--dataset=photos: training images to write.")
_DATA_DIR = flags.DEFINE_string('data_dir', '', 'tfds data_dir.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where files go.',
                                  required=True)
_SPLITS = flags.DEFINE_list('splits', ['train', 'test'],
                            'tfds splits, written as train-* and eval-*.')
_NUM_FILES = flags.DEFINE_integer('num_files', 4, 'Files per split.')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 0,
                                   'Resize to this square size; 0 keeps it.')
_FORMAT = flags.DEFINE_enum('format', 'jpeg', ['jpeg', 'png'], 'Encoding.')
_MAX_SIDE = flags.DEFINE_integer(
    'max_side', 0, 'Resize every image larger than this, its aspect kept, so '
    'its longer side is this many pixels, and store it as a JPEG of '
    '--quality (random-resized crops need the aspect; a smaller JPEG '
    'decodes faster); 0 keeps each as it is.', lower_bound=0)
_QUALITY = flags.DEFINE_integer(
    'quality', 90, 'JPEG quality of what is re-encoded (--max_side, '
    '--image_size).', lower_bound=1, upper_bound=100)
_LABEL_OFFSET = flags.DEFINE_integer(
    'label_offset', 0, 'Added to every label (1 mimics ImageNet files).')
_FROM_DIR = flags.DEFINE_string(
    'from_dir', '', 'A folder of class folders to write instead of a tfds '
    'set (local or gs://).')
_EVAL_DIR = flags.DEFINE_string(
    'eval_dir', '', '--from_dir: a folder of the same class folders to '
    'write as eval-*; without it --eval_fraction of each class.')
_EVAL_FRACTION = flags.DEFINE_float(
    'eval_fraction', default.get_config().eval_fraction, '--from_dir: the '
    'share of each class held out, as --config.eval_fraction holds it out.')


def from_dir(output_dir):
  """Writes --from_dir's split as train-* and eval-*, and labels.txt."""
  config = ml_collections.ConfigDict(dict(
      train_dir=_FROM_DIR.value, eval_dir=_EVAL_DIR.value,
      eval_fraction=_EVAL_FRACTION.value))
  names, files = image_folder.splits(config)
  tf.io.gfile.makedirs(output_dir)
  for split, prefix in (('train', 'train'), ('eval', 'eval')):
    path = os.path.join(output_dir, prefix)
    count = tfrecords.write_shards(
        path, _NUM_FILES.value, _bounded(
            (listed_files.read_bytes(name), label + _LABEL_OFFSET.value)
            for name, label in files[split]))
    logging.info('Wrote %d %s images of %d classes to %s-*', count, split,
                 len(names), path)
  tfrecords.write_labels(output_dir, names)


def _bounded(examples):
  """(encoded, label) pairs, each image within --max_side where set."""
  for encoded, label in examples:
    yield ((tfrecords.bounded(encoded, _MAX_SIDE.value, _QUALITY.value)
            if _MAX_SIDE.value else encoded), label)


def main(argv):
  del argv
  if _FROM_DIR.value:
    try:
      from_dir(_OUTPUT_DIR.value)
    except UserError as e:
      sys.exit(f'error: {e}')
    return
  if len(_SPLITS.value) != 2:
    sys.exit(f'error: --splits={",".join(_SPLITS.value)} must name two '
             'splits: train and eval')
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  if _DATASET.value == 'photos':
    for prefix, count, seed in (('train', _NUM_EXAMPLES.value, 0),
                                ('eval', max(_NUM_EXAMPLES.value // 10, 1), 1)):
      path = os.path.join(_OUTPUT_DIR.value, prefix)
      mean = photos.write(path, count, _NUM_FILES.value, seed=seed,
                          transform=_bounded)
      logging.info('Wrote %d photographs (%.0f KiB each on average) to %s-*',
                   count, mean / 1024, path)
    return
  for split, prefix in zip(_SPLITS.value, ('train', 'eval')):
    count = tfrecords.export_tfds(
        _DATASET.value, _DATA_DIR.value, split,
        os.path.join(_OUTPUT_DIR.value, prefix), _NUM_FILES.value,
        _IMAGE_SIZE.value, _FORMAT.value, _LABEL_OFFSET.value,
        transform=_bounded, quality=_QUALITY.value)
    logging.info('Wrote %d %s examples to %s-*', count, split,
                 os.path.join(_OUTPUT_DIR.value, prefix))


if __name__ == '__main__':
  app.run(main)
