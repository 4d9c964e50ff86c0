"""What this machine learnt, kept in this user's cache folder: compiled
programs, measured policies and backends. Never a workdir that others read:
the figures hold for this machine's hardware and software only."""

import json
import os
import re


def folder(*parts):
  """A folder in this user's cache (XDG_CACHE_HOME, else ~/.cache)."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'efficientnet-pipeline', *parts)


def slug(text):
  """`text` as one safe file or folder name."""
  return re.sub(r'[^A-Za-z0-9.]+', '-', text).strip('-')


def read_json(path):
  """The record at `path`, or None where there is none; OSError or
  ValueError for a file that cannot be read."""
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def write_json(path, record):
  """Writes `record` to `path` whole or not at all (a rename)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=2)
  os.replace(path + '.tmp', path)
