"""The one exception type for mistakes a user can fix.

The launchers turn a UserError into a one-line message and a non-zero exit,
with no traceback; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
  """A bad flag, config value, path or environment, explained in one line."""


class Preempted(Exception):
  """SIGTERM arrived; a checkpoint was saved and committed before stopping."""


def first_line(error):
  """The first line of an exception's message, for one-line reports."""
  text = getattr(error, 'message', None) or str(error) or type(error).__name__
  return (text.strip().splitlines() or [type(error).__name__])[0]
