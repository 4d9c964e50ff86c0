"""Turns errors raised while flags are parsed into one readable line."""

import re
import sys

from absl import flags


def config_error(error, argv):
  """One line for a config file that does not load or a key it lacks."""
  text = str(error).strip("'\" ")
  if isinstance(error, OSError):
    paths = [a.split('=', 1)[1] for a in argv if a.startswith('--config=')]
    return (f'config file {paths[-1] if paths else "?"!r} could not be loaded; '
            'pass a Python file with get_config(), e.g. configs/default.py')
  key = re.match(r"[\\']*([\w.]+)", text)
  hint = re.search(r'Did you mean "([\w.]+)"', text)
  return (f'unknown config key {key.group(1) if key else text!r}'
          + (f' (did you mean {hint.group(1)!r}?)' if hint else '')
          + '; the keys are the fields of the config file, e.g. '
          'configs/default.py, set as --config.KEY=VALUE')


def parse_flags(argv):
  """absl's flag parsing, with config-file errors as one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f'FATAL Flags parsing error: {e}\n'
             'Pass --helpshort or --helpfull to see help on flags.')
  except (AttributeError, KeyError, OSError) as e:
    sys.exit('error: ' + config_error(e, argv))
