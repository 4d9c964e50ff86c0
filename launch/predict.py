"""Top classes for image files, from an export of launch.train.

  python -m launch.predict --model=runs/x/export photo.jpg 'more/*.png'
  python -m launch.predict --model=runs/x/export --output=predictions.csv 'imgs/*'
  python -m launch.predict --model=runs/x/export/model.onnx photo.jpg

JPEG or PNG files of any size are preprocessed as evaluation does (read
from the export's metadata.json). A file that cannot be read or decoded
gets one line and is skipped; the exit status is non-zero if none could be.
"""

import csv
import json
import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from pipeline.reports import learning
from pipeline.reports import predict
from pipeline.errors import UserError

MODEL = flags.DEFINE_string('model', None, 'The export folder of a run '
                            '(<workdir>/export), or the model.onnx in it.',
                            required=True)
TOP_K = flags.DEFINE_integer('top_k', 3, 'Classes shown per image.')
LABELS = flags.DEFINE_string('labels', '', 'A text file with one class name '
                             'per line, instead of the names in the export.')
OUTPUT = flags.DEFINE_string('output', '', 'Also write the predictions to '
                             'this .csv or .json file.')


def main(argv):
  try:
    if len(argv) < 2:
      raise UserError('name image files or globs after the flags, e.g. '
                      'python -m launch.predict --model=runs/x/export a.jpg')
    if OUTPUT.value and not OUTPUT.value.endswith(('.csv', '.json')):
      raise UserError(f'--output={OUTPUT.value} must end in .csv or .json')
    model, metadata = predict.load(MODEL.value)
    names = metadata['class_names']
    if LABELS.value:
      with open(LABELS.value) as f:
        names = [line.strip() for line in f if line.strip()]
      if len(names) != len(metadata['class_names']):
        raise UserError(f'--labels={LABELS.value} has {len(names)} names; '
                        f'the model has {len(metadata["class_names"])} classes')
    images, paths, skipped = predict.read_images(
        predict.expand(argv[1:]), metadata['preprocessing'])
    for path, reason in skipped:
      print(f'skipped {path}: {reason}', file=sys.stderr)
    if images is None:
      raise UserError('no image could be read; JPEG and PNG files are '
                      'accepted')
    probabilities = predict.probabilities(model, images)
    rows = predict.top_k(probabilities, names, TOP_K.value)
  except (UserError, OSError) as e:
    sys.exit(f'error: {e}')
  for path, row in zip(paths, rows):
    print(f'{path}: ' + ', '.join(f'{name} {p:.3f}' for name, p in row))
  flat = learning.flat_probabilities(probabilities, paths)
  if flat:
    print(f'warning: {flat}', file=sys.stderr)
  if OUTPUT.value:
    _write(OUTPUT.value, paths, rows)


def _write(path, paths, rows):
  if path.endswith('.json'):
    with open(path, 'w') as f:
      json.dump([{'file': p, 'top': [{'class': n, 'probability': q}
                                     for n, q in row]}
                 for p, row in zip(paths, rows)], f, indent=2)
    return
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['file'] + [f'{kind}_{i + 1}' for i in range(len(rows[0]))
                                for kind in ('class', 'probability')])
    for p, row in zip(paths, rows):
      writer.writerow([p] + [v for pair in row for v in pair])


if __name__ == '__main__':
  app.run(main)
