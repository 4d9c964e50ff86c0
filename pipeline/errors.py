"""Exceptions the launchers turn into a one-line message and an exit code.

UserError is a mistake the user can fix (a bad flag, config value, path or
environment): one line and exit status 1. Stopped is a stop that was asked
for (SIGTERM, Ctrl-C) and handled: a checkpoint was committed, one line and
exit status 128 + the signal's number (pipeline/rules/machine/stopping.py).
Anything else is a bug and keeps its traceback.
"""

import re


class UserError(Exception):
  """A bad flag, config value, path or environment, explained in one line."""


class Stopped(Exception):
  """SIGTERM or Ctrl-C arrived and was handled; the message is the line a
  launcher prints, `exit_status` what it exits with (143, 130)."""

  def __init__(self, signum, message):
    super().__init__(message)
    self.signum = signum
    self.exit_status = 128 + int(signum)


def first_line(error):
  """The first line of an exception's message, for one-line reports.

  TensorFlow's op errors lose their '{{function_node ...}}' prefix and
  ' [Op:Name]' suffix: they name TensorFlow's internals, not the problem.
  """
  text = getattr(error, 'message', None) or str(error) or type(error).__name__
  line = (text.strip().splitlines() or [type(error).__name__])[0]
  line = re.sub(r'^\{\{function_node [^}]*\}\}\s*', '', line)
  return re.sub(r'\s*\[Op:\w+\].*$', '', line) or type(error).__name__
