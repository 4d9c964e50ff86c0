"""TensorFlow's persistent XLA caches: its compiled programs and XLA's GPU
autotuning results, both set by flags TensorFlow reads as it loads.

TensorFlow fails a run on an entry it cannot read ("Read less bytes than
requested") instead of compiling again, and on an entry compiled by other
software or another GPU model: so the folder is keyed by both, and damaged
entries are set aside before TensorFlow loads.
"""

import glob
import logging
import os
import re

from google.protobuf import empty_pb2
from google.protobuf import text_format
from google.protobuf import unknown_fields

from pipeline.rules.speed import compile_cache
from pipeline.rules.speed.compile_cache import Settings

TF_FLAG = '--tf_xla_persistent_cache_directory'
AUTOTUNE_FLAG = '--xla_gpu_per_fusion_autotune_cache_dir'
# XlaSerializedCacheEntry's fields: key, hlo_module, executable.
_ENTRY_FIELDS = {1, 2, 3}


def choose(setting, environ, gpus, versions):
  """Settings for compile_cache_dir=`setting` (not 'off') on TensorFlow."""
  tf_flags = environ.get('TF_XLA_FLAGS', '')
  if TF_FLAG[2:] in tf_flags:
    mine = re.search(f'{TF_FLAG}=(\\S+)', tf_flags)
    return Settings(setting, mine.group(1) if mine else None,
                    'your TF_XLA_FLAGS')
  if not setting and not gpus:
    return compile_cache.off_on_a_cpu(setting)
  folder = os.path.expanduser(setting) or os.path.join(
      compile_cache.root(), compile_cache.slug(versions),
      compile_cache.slug('+'.join(gpus)))
  environment = {'TF_XLA_FLAGS': f'{tf_flags} {TF_FLAG}={folder}'.strip()}
  xla_flags = environ.get('XLA_FLAGS', '')
  if gpus and AUTOTUNE_FLAG[2:] not in xla_flags:
    environment['XLA_FLAGS'] = (
        f'{xla_flags} {AUTOTUNE_FLAG}={os.path.join(folder, "autotune")}'
    ).strip()
  return Settings(setting, folder, compile_cache.first_run(setting),
                  environment)


def set_aside_damaged(folder):
  """Moves entries TensorFlow or XLA could not read into folder/damaged/,
  one line for them; returns their new paths. TensorFlow fails a run on an
  unreadable entry ("Read less bytes than requested") instead of compiling
  again, so it must never see one."""
  damaged = [path for path in sorted(glob.glob(os.path.join(folder, '*.pb')))
             if not _readable_program(path)]
  damaged += [path for path in sorted(glob.glob(
      os.path.join(folder, 'autotune', '*.textproto')))
              if not _readable_text(path)]
  moved = []
  for path in damaged:
    target = os.path.join(folder, 'damaged', os.path.basename(path))
    try:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.replace(path, target)
      moved.append(target)
    except OSError:
      continue  # Another run moved it first.
  if moved:
    logging.warning('compile cache: %d damaged entr%s set aside in %s; '
                    'compiling %s again', len(moved),
                    'y' if len(moved) == 1 else 'ies',
                    os.path.join(folder, 'damaged'),
                    'it' if len(moved) == 1 else 'them')
  return moved


def _read(path):
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError:
    return None


def _readable_program(path):
  """Whether `path` parses as TensorFlow's serialized cache entry (binary
  protobuf with its key, HLO and executable fields). No schema is needed:
  protobuf keeps the fields it does not know and rejects corrupt wire data."""
  data = _read(path)
  message = empty_pb2.Empty()
  try:
    message.ParseFromString(data or b'')
  except Exception:  # pylint: disable=broad-except  (DecodeError and kin)
    return False
  fields = {f.field_number for f in unknown_fields.UnknownFieldSet(message)}
  return _ENTRY_FIELDS <= fields


def _readable_text(path):
  """Whether `path` is whole protobuf text (XLA's autotune entries): every
  token consumed and every brace closed."""
  data = _read(path)
  if not data:
    return False
  try:
    tokens = text_format.Tokenizer(data.decode('utf-8').splitlines())
    depth = 0
    while not tokens.AtEnd():
      if tokens.TryConsume('{') or tokens.TryConsume('<'):
        depth += 1
      elif tokens.TryConsume('}') or tokens.TryConsume('>'):
        depth -= 1
      else:
        tokens.NextToken()
      if depth < 0:
        return False
    return depth == 0
  except (UnicodeDecodeError, text_format.ParseError):
    return False
