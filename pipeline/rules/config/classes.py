"""A run's class names against the data's. A label is an index into them,
so a run resumed, or a head carried over by init_from, on other names would
answer for other classes: both are refused in one line."""

from pipeline.errors import UserError
from pipeline.storage import workdirs


def differing(theirs, ours, shown=5):
  """The names one side has and the other lacks, for the one line."""
  changed = sorted(set(theirs) ^ set(ours)) or ['their order']
  return (f'{len(theirs)} classes; these data have {len(ours)} (differing: '
          f'{", ".join(changed[:shown])})')


def check_resumed(workdir, class_names):
  """A one-line UserError if the run the workdir holds was trained on other
  class names (a class folder added, removed or renamed)."""
  saved = (workdir.read_json(workdirs.File.RUN) or {}).get('resolved', {})
  theirs = tuple(saved.get('class_names') or ())
  if theirs and class_names and theirs != tuple(class_names):
    raise UserError(
        f'workdir {workdir.url!r} holds a run trained on '
        f'{differing(theirs, class_names)}; restore the class folders or use '
        'another --workdir')
