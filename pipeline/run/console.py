"""What a person sees: short console lines, a live progress bar, a log file.

The console shows the run's own lines as "HH:MM:SS message" and every
library's warnings and errors; other libraries' INFO lines (tfds reading
files, checkpoint sharding timings, SavedModel renaming notices) go only to
the log file, which gets everything in absl's full format (`run.log` in the
workdir; records from before the workdir is known are kept and written
first). On a terminal a progress bar (tqdm) shows the current stretch of
steps and is erased when that stretch's summary line prints; anywhere else
(a pipe, a file, a cloud job's log) there is no bar and no control
character. absl's --verbosity still sets what is logged.

TensorFlow's native start-up lines are filtered earlier, at the file
descriptor, and never reach the file; native lines about the run that need
no reading (XLA ignoring an assert, its GPU autotuner's timer) go to the
file only (pipeline/run/environment.py).
"""

import logging as std_logging
import logging.handlers
import os
import sys

from absl import logging

from pipeline.run import environment
from pipeline.storage import workdirs

LOG_FILE = workdirs.File.LOG
_OWN = tuple(os.path.join(environment.REPO, folder) + os.sep
             for folder in ('pipeline', 'launch', 'configs'))


class _Short(std_logging.Formatter):
  """'HH:MM:SS message'; warnings and errors say so."""

  def __init__(self):
    super().__init__('%(asctime)s %(message)s', '%H:%M:%S')

  def format(self, record):
    text = super().format(record)
    if record.levelno >= std_logging.WARNING:
      time, message = text.split(' ', 1)
      text = f'{time} {record.levelname}: {message}'
    return text


class _ConsoleFilter(std_logging.Filter):
  """Own lines and everyone's warnings; erases a live bar before a line."""

  def __init__(self):
    super().__init__()
    self.bar = None

  def filter(self, record):
    shown = (record.levelno >= std_logging.WARNING or
             record.pathname.startswith(_OWN))
    if shown and self.bar is not None:
      self.bar.clear()
    return shown


_console_filter = _ConsoleFilter()
_pending = None  # Records kept until the log file exists.


def setup():
  """Short console lines; records kept for the log file. Call after flags
  are parsed (absl's handler exists then)."""
  global _pending
  handler = logging.get_absl_handler()
  handler.setFormatter(_Short())
  if _console_filter not in handler.filters:
    handler.addFilter(_console_filter)
  if _pending is None:
    _pending = std_logging.handlers.BufferingHandler(capacity=100_000)
    std_logging.getLogger().addHandler(_pending)


def log_to_file(path):
  """From now on, and for everything logged since setup(), also `path`."""
  global _pending
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  file_handler = std_logging.FileHandler(path)
  file_handler.setFormatter(logging.PythonFormatter())
  root = std_logging.getLogger()
  if _pending is not None:
    root.removeHandler(_pending)
    for record in _pending.buffer:
      file_handler.handle(record)
    _pending = None
  root.addHandler(file_handler)
  environment.native_lines_to(os.path.abspath(path))
  return file_handler


def stop_logging_to(file_handler):
  if file_handler is not None:
    environment.native_lines_to('')
    std_logging.getLogger().removeHandler(file_handler)
    file_handler.close()


def duration(seconds):
  """'1h 02m', '4m 05s', '12s': a time span as a progress line gives it."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f'{seconds // 3600}h {seconds % 3600 // 60:02d}m'
  if seconds >= 60:
    return f'{seconds // 60}m {seconds % 60:02d}s'
  return f'{seconds}s'


def live_bar(total, description):
  """A progress bar on a terminal, else None. Its owner closes it."""
  if not sys.stderr.isatty():
    return None
  import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm.tqdm(total=total, desc=description, unit='step', leave=False,
                  file=sys.stderr, dynamic_ncols=True)
  _console_filter.bar = bar
  return bar


def close_bar(bar):
  if bar is not None:
    bar.close()
    if _console_filter.bar is bar:
      _console_filter.bar = None
