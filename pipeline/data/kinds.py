"""The values of config.dataset, and what the rest of a run asks of each.

No module but this one and sources.py (which maps each value to the loader
that reads it) compares config.dataset with a name: validation asks a kind
for its checks, the workdir for the paths its workers read, evaluation for
the split it holds out, DALI and the benchmark whether it is TFRecord
files, the plan whether its class names are the user's. A new source is an
entry here, its loader in sources.py, and its keys in configs/default.py.

This module imports no TensorFlow: DALI's choice reads it on the JAX path.
"""

import dataclasses
from typing import Callable

from pipeline.errors import UserError


def _no_check(config):
  del config


def _held_out_or_eval_split(config):
  return config.eval_split or 'held-out'


def _check_eval_fraction(config):
  if not 0 < config.eval_fraction < 1:
    raise UserError(f'eval_fraction={config.eval_fraction} must be in (0, 1): '
                    'the share held out for evaluation')


@dataclasses.dataclass(frozen=True)
class Kind:
  """What a run asks of one value of config.dataset."""
  # config -> {flag: path}: what the input workers read ('' is a default).
  inputs: Callable[..., dict]
  # config -> the name of the split evaluation reads.
  held_out: Callable[..., str] = _held_out_or_eval_split
  # config -> None, or a one-line UserError for a field of this source.
  check: Callable[..., None] = _no_check
  # Its files are TFRecords: DALI and the reference input can read them.
  record_files: bool = False
  # Its class names are the user's (folders, labels.txt): the plan shows them.
  names_classes: bool = False


KINDS = {
    'tfrecord': Kind(
        inputs=lambda c: {'train_files': c.train_files,
                          'eval_files': c.eval_files},
        held_out=lambda c: c.eval_files, record_files=True,
        names_classes=True),
    'image_folder': Kind(
        inputs=lambda c: {'train_dir': c.train_dir,
                          **({'eval_dir': c.eval_dir} if c.eval_dir else {})},
        check=_check_eval_fraction, names_classes=True),
    'csv': Kind(
        inputs=lambda c: {'train_csv': c.train_csv,
                          **({'eval_csv': c.eval_csv} if c.eval_csv else {})},
        check=_check_eval_fraction, names_classes=True),
}
# Any other value names a tensorflow-datasets set.
TFDS = Kind(inputs=lambda c: {'data_dir': c.data_dir})


def of(config):
  """The Kind of `config.dataset`."""
  return KINDS.get(config.dataset, TFDS)
