"""Write a tensorflow-datasets split as TFRecord files in the TPU layout.

  python -m launch.make_tfrecords --output_dir=/tmp/digits_tfrecords
  python -m launch.train --config.dataset=tfrecord \
      --config.train_files='/tmp/digits_tfrecords/train-*' \
      --config.eval_files='/tmp/digits_tfrecords/eval-*' --config.num_classes=10

Useful to feed TPU Nodes (which read only gs://) and for the input benchmark:
--dataset=photos writes colour photographs of ImageNet-like size instead
(pipeline/data/photos.py; --num_examples of them, a tenth as many for eval).

  python -m launch.make_tfrecords --dataset=photos --output_dir=/tmp/photos
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

from pipeline.data import photos
from pipeline.data import tfrecords

_DATASET = flags.DEFINE_string(
    'dataset', 'sklearn_digits', "tfds name, or 'photos' (pipeline/data/photos.py).")
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
_LABEL_OFFSET = flags.DEFINE_integer(
    'label_offset', 0, 'Added to every label (1 mimics ImageNet files).')


def main(argv):
  del argv
  if len(_SPLITS.value) != 2:
    sys.exit(f'error: --splits={",".join(_SPLITS.value)} must name two '
             'splits: train and eval')
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  if _DATASET.value == 'photos':
    for prefix, count, seed in (('train', _NUM_EXAMPLES.value, 0),
                                ('eval', max(_NUM_EXAMPLES.value // 10, 1), 1)):
      path = os.path.join(_OUTPUT_DIR.value, prefix)
      mean = photos.write(path, count, _NUM_FILES.value, seed=seed)
      logging.info('Wrote %d photographs (%.0f KiB each on average) to %s-*',
                   count, mean / 1024, path)
    return
  for split, prefix in zip(_SPLITS.value, ('train', 'eval')):
    count = tfrecords.export_tfds(
        _DATASET.value, _DATA_DIR.value, split,
        os.path.join(_OUTPUT_DIR.value, prefix), _NUM_FILES.value,
        _IMAGE_SIZE.value, _FORMAT.value, _LABEL_OFFSET.value)
    logging.info('Wrote %d %s examples to %s-*', count, split,
                 os.path.join(_OUTPUT_DIR.value, prefix))


if __name__ == '__main__':
  app.run(main)
