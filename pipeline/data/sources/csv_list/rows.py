"""A CSV of image paths and labels, the form many data sets come in (a
Kaggle competition's train.csv beside its folder of images):

  --config.dataset=csv --config.train_csv=PATH [--config.eval_csv=PATH]

A header row names the columns: the image's path (path, image, file or
filename) and its label (label, class or category); other columns are
ignored. A path is relative to its CSV's folder, or absolute; local or
gs://. Labels are class names throughout (indices in their sorted order,
as an image folder's, and recorded with the run) or integers from 0
throughout. Without an eval CSV, eval_fraction of the rows are held out by
the image folder's hash of the path. A named file that is missing or does
not decode is skipped, counted and named like an undecodable record.
"""

import csv
import io
import os
import posixpath
import re

from absl import logging
import tensorflow as tf

from pipeline.data.sources import listed_files
from pipeline.errors import UserError
from pipeline.errors import first_line
from pipeline.storage import gcs

PATH_COLUMNS = ('path', 'image', 'file', 'filename')
LABEL_COLUMNS = ('label', 'class', 'category')


def splits(settings):
  """(class names, {'train': files, 'eval': files}, num_classes), files
  [(path, label)] as image_folder's tree.splits'; names () for integer labels."""
  train = _rows(settings.train_csv)
  evaluated = _rows(settings.eval_csv) if settings.eval_csv else []
  names, labels = _labels(train + evaluated)
  num_classes = len(names) or _num_classes(settings.num_classes,
                                           train + evaluated, labels)
  files = [(row[0], label) for row, label in zip(train + evaluated, labels)]
  if evaluated:
    return names, {'train': files[:len(train)],
                   'eval': files[len(train):]}, num_classes
  return names, listed_files.hold_out(
      files, _folder(settings.train_csv), settings.eval_fraction,
      f'rows of {settings.train_csv!r}'), num_classes


def missing(files):
  """The local files of `files` that are not there, the first named once;
  one line for a split none of whose files is there. (A gs:// file is not
  looked up one by one: a missing one is passed over, as an image folder's
  file deleted after its listing.)"""
  gone = {path for part in files.values() for path, _ in part
          if not gcs.is_gcs(path) and not os.path.exists(path)}
  for split, part in files.items():
    if part and all(path in gone for path, _ in part):
      raise UserError(f'none of the {len(part)} {split} file(s) the CSV '
                      f'names is there, e.g. {part[0][0]}')
  if gone:
    logging.warning('%d file(s) the CSV names are missing, e.g. %s: each is '
                    'skipped and counted', len(gone), min(gone))
  return gone


def read_files(files, missing, input_context, shuffle, seed):
  """(bytes, label, path) records as listed_files.read_files' of the files
  that are there, then one without bytes for each of `missing` (this
  pipeline's share; a training run's shuffle mixes them in), which fails
  to decode and so is skipped, counted and named like a damaged file."""
  gone = set(missing)
  present = [(path, label) for path, label in files if path not in gone]
  absent = [(path, label) for path, label in files if path in gone]
  records = listed_files.read_files(present, input_context, shuffle, seed)
  if not absent:
    return records
  paths, labels = zip(*absent)
  return records.concatenate(tf.data.Dataset.from_tensor_slices(
      ([b''] * len(paths), list(labels), list(paths))).shard(
          input_context.num_input_pipelines, input_context.input_pipeline_id))


def _rows(csv_path):
  """[(image path, label text, row number, csv_path)] of one CSV; one line
  for a CSV that cannot be read or lacks a column, a field or a row."""
  try:
    text = listed_files.read_bytes(csv_path).decode('utf-8-sig')
  except Exception as e:  # Missing, unreadable, not UTF-8: all one line.
    raise UserError(f'cannot read the CSV {csv_path!r}: {first_line(e)}')
  reader = csv.reader(io.StringIO(text))
  header = next(reader, None)
  accepted = (f'a header row naming a path column ({", ".join(PATH_COLUMNS)})'
              f' and a label column ({", ".join(LABEL_COLUMNS)})')
  if not header:
    raise UserError(f'the CSV {csv_path!r} is empty; expected {accepted}')
  columns = [name.strip().lower() for name in header]
  at = {}
  for role, names in (('path', PATH_COLUMNS), ('label', LABEL_COLUMNS)):
    found = [i for i, name in enumerate(columns) if name in names]
    if not found:
      raise UserError(f'row 1 of {csv_path!r} ({",".join(header)}) names no '
                      f'{role} column; expected {accepted}')
    at[role] = found[0]
  folder, rows = _folder(csv_path), []
  for number, row in enumerate(reader, start=2):
    if not any(cell.strip() for cell in row):
      continue  # A blank line, often the last.
    if len(row) <= max(at.values()):
      raise UserError(f'row {number} of {csv_path!r} has {len(row)} '
                      f'field(s); its header has {len(header)}')
    path, label = row[at['path']].strip(), row[at['label']].strip()
    if not path or not label:
      raise UserError(f'row {number} of {csv_path!r} has an empty '
                      f'{"path" if not path else "label"}')
    rows.append((_resolve(folder, path), label, number, csv_path))
  if not rows:
    raise UserError(f'the CSV {csv_path!r} has a header and no rows')
  return rows


def _labels(rows):
  """(class names, each row's label index): names sorted, or () where every
  label is an integer; one line for a column of both."""
  numbers = [row for row in rows if _is_integer(row[1])]
  if numbers and len(numbers) < len(rows):
    name = next(row for row in rows if not _is_integer(row[1]))
    raise UserError(
        f'row {name[2]} of {name[3]!r} has the label {name[1]!r}, a name, and '
        f'row {numbers[0][2]} of {numbers[0][3]!r} has {numbers[0][1]!r}, a '
        'number; use class names throughout, or integers from 0')
  if numbers:
    return (), [int(row[1]) for row in rows]
  names = tuple(sorted({row[1] for row in rows}))
  index = {name: i for i, name in enumerate(names)}
  return names, [index[row[1]] for row in rows]


def _num_classes(given, rows, labels):
  """Integer labels: num_classes, or the largest label plus one."""
  num_classes = given or max(labels) + 1
  for row, label in zip(rows, labels):
    if label < 0:
      raise UserError(f'row {row[2]} of {row[3]!r} has the label {label}; '
                      'integer labels count from 0')
    if label >= num_classes:
      raise UserError(f'row {row[2]} of {row[3]!r} has the label {label}, '
                      f'outside [0, {num_classes}) (num_classes='
                      f'{given})')
  return num_classes


def _is_integer(text):
  return re.fullmatch(r'-?\d+', text) is not None


def _folder(csv_path):
  if gcs.is_gcs(csv_path):
    return posixpath.dirname(csv_path)
  return os.path.dirname(os.path.abspath(csv_path))


def _resolve(folder, path):
  if gcs.is_gcs(path) or os.path.isabs(path):
    return path
  join = posixpath.join if gcs.is_gcs(folder) else os.path.join
  return join(folder, path)
