"""Which of the two checkpoint formats a run's files are in.

Each backend writes one (Backend.checkpoint_format) and both read either
(checkpoint_files.py). The run names its format in run.json, as the plan
resolved it ('resolved' -> 'checkpoint_format'), and `of_run` reads it back,
for launch.evaluate, init_from and a resumed run alike. A run.json from
before it named one gives None: the reader then goes by the files
themselves (checkpoint_files.reader). Importable without TensorFlow, JAX
or Keras: the backends' table names its format.
"""

import enum

KEY = 'checkpoint_format'  # Of run.json's 'resolved' object.


class Format(enum.Enum):
  TF_CHECKPOINT = 'tf.train.Checkpoint'  # With its object graph.
  KERAS_WEIGHTS = 'keras .weights.h5'  # Keras' own, of any backend's arrays.

  def __str__(self):
    return self.value


def of_run(resolved):
  """The Format a run's run.json 'resolved' object names; None where it
  names none (written before it did), or a one-line ValueError for a name
  no format has."""
  named = resolved.get(KEY)
  if named is None:
    return None
  try:
    return Format(named)
  except ValueError:
    raise ValueError(f'checkpoint_format {named!r} is none of '
                     + ', '.join(repr(f.value) for f in Format)) from None
