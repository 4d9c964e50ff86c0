"""Persistent XLA caches: a machine compiles a program once, not every run.

On an H100 every TensorFlow run spent 2 to 3 minutes in XLA compiling and
autotuning B0's program, in each new process (the driver's PTX cache is not
it). TensorFlow keeps compiled programs across processes with
`--tf_xla_persistent_cache_directory` (TF_XLA_FLAGS) and XLA keeps its GPU
autotuning results with `--xla_gpu_per_fusion_autotune_cache_dir`
(XLA_FLAGS); JAX has its own compilation cache, which holds its autotuning
too. Both flags are read once, as TensorFlow loads, so `prepare` runs
before (from environment.prepare) and the plan only reports it.

The folder is per user (~/.cache, never a workdir that others read) and
per software and GPU model, so an entry compiled by another TensorFlow,
cuDNN or GPU is never offered: TensorFlow would fail the run on it, not
recompile. For the same reason a damaged entry is set aside before
TensorFlow can read it (one line), and an unwritable folder turns the cache
off (one line): a failed write fails the compile too.

Importable without TensorFlow.
"""

import dataclasses
import glob
import logging
import os
import re

from google.protobuf import empty_pb2
from google.protobuf import text_format
from google.protobuf import unknown_fields

from pipeline import backend
from pipeline.errors import UserError

TF_FLAG = '--tf_xla_persistent_cache_directory'
AUTOTUNE_FLAG = '--xla_gpu_per_fusion_autotune_cache_dir'
JAX_VARIABLE = 'JAX_COMPILATION_CACHE_DIR'
_NVIDIA_GPUS = '/proc/driver/nvidia/gpus/*/information'
# XlaSerializedCacheEntry's fields: key, hlo_module, executable.
_ENTRY_FIELDS = {1, 2, 3}
_OFF_ON_A_CPU = 'off on a CPU unless --config.compile_cache_dir=DIR'


@dataclasses.dataclass(frozen=True)
class Settings:
  """What this process compiles into: a folder (None: no cache), and why."""
  setting: str  # The config's compile_cache_dir it was chosen from.
  directory: str | None
  reason: str
  environment: dict = dataclasses.field(default_factory=dict)

  def describe(self):
    if not self.directory:
      return f'no compile cache ({self.reason})'
    return f'compiled programs cached in {self.directory} ({self.reason})'


_chosen = []


def user_folder(*parts):
  """A folder in this user's cache (XDG_CACHE_HOME, else ~/.cache): what
  this machine learnt, never a workdir that others read."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'efficientnet-pipeline', *parts)


def root():
  """Where compiled programs go unless compile_cache_dir says."""
  return user_folder('xla')


def gpu_models():
  """The NVIDIA GPU models the driver lists, read without loading CUDA."""
  models = set()
  for path in glob.glob(_NVIDIA_GPUS):
    try:
      with open(path, encoding='utf-8', errors='replace') as f:
        models.update(m.group(1).strip() for m in re.finditer(
            r'^Model:\s*(.+)$', f.read(), re.M))
    except OSError:
      continue
  if not models and os.path.exists('/dev/nvidia0'):
    models.add('NVIDIA GPU')
  return sorted(models)


def slug(text):
  return re.sub(r'[^A-Za-z0-9.]+', '-', text).strip('-')


def choose(setting, backend_name, environ, gpus, accelerator, versions):
  """Returns Settings for compile_cache_dir=`setting` ('' picks, 'off', or a
  folder). `gpus`: GPU models seen; `accelerator`: a TPU or GPU is there;
  `versions`: the software the folder is keyed by, e.g. 'tf-2.21.0'."""
  if setting == 'off':
    return Settings(setting, None, 'compile_cache_dir=off')
  if '://' in setting:
    raise UserError(f'compile_cache_dir={setting}: a local folder, or off '
                    '(compiled programs are per machine)')
  if backend_name == 'jax':
    if environ.get(JAX_VARIABLE):
      return Settings(setting, environ[JAX_VARIABLE], f'your {JAX_VARIABLE}')
    if not setting and not accelerator:
      return Settings(setting, None, _OFF_ON_A_CPU)
    folder = os.path.expanduser(setting) or os.path.join(
        root(), slug(versions))
    # JAX keys its entries by device and software itself.
    return Settings(setting, folder, _first_run(setting, 'JAX version'),
                    {JAX_VARIABLE: folder})
  tf_flags = environ.get('TF_XLA_FLAGS', '')
  if TF_FLAG[2:] in tf_flags:
    mine = re.search(f'{TF_FLAG}=(\\S+)', tf_flags)
    return Settings(setting, mine.group(1) if mine else None,
                    'your TF_XLA_FLAGS')
  if not setting and not gpus:
    return Settings(setting, None, _OFF_ON_A_CPU)
  folder = os.path.expanduser(setting) or os.path.join(
      root(), slug(versions), slug('+'.join(gpus)))
  environment = {'TF_XLA_FLAGS': f'{tf_flags} {TF_FLAG}={folder}'.strip()}
  xla_flags = environ.get('XLA_FLAGS', '')
  if gpus and AUTOTUNE_FLAG[2:] not in xla_flags:
    environment['XLA_FLAGS'] = (
        f'{xla_flags} {AUTOTUNE_FLAG}={os.path.join(folder, "autotune")}'
    ).strip()
  return Settings(setting, folder, _first_run(setting), environment)


def _first_run(setting, keyed_by='software and GPU'):
  where = 'compile_cache_dir' if setting else f'per user, {keyed_by}'
  return (f'{where}; the first run on a machine compiles, for minutes on a '
          'GPU or TPU, later runs load')


def versions(backend_name):
  """The software a compiled program (or a measurement) holds for, e.g.
  'tf-2.21.0-cudnn-9.28.0.42'."""
  if backend_name == 'jax':
    return f'jax-{backend.installed("jaxlib")}'
  tf = next(filter(None, map(backend.installed, (
      'tensorflow', 'tensorflow-cpu', 'tensorflow-tpu'))), 'unknown')
  cudnn = backend.installed('nvidia-cudnn-cu12')
  return f'tf-{tf}' + (f'-cudnn-{cudnn}' if cudnn else '')


def prepare(setting, environ=None, gpus=None, software=None):
  """Chooses and sets up this process's cache in `environ` (os.environ
  unless given), before TensorFlow or JAX load; returns the Settings, also
  kept for `chosen`. `gpus` and `software` stand in for this machine's
  (tests); None looks."""
  environ = os.environ if environ is None else environ
  name, _ = backend.current()
  gpus = gpu_models() if gpus is None else gpus
  settings = choose(setting or '', name, environ, gpus,
                    bool(gpus) or backend.tpu_attached(),
                    software or versions(name))
  if settings.environment:
    problem = _usable(settings.directory)
    if problem:
      settings = Settings(settings.setting, None, problem)
    else:
      environ.update(settings.environment)
  if settings.directory and name == 'tensorflow':
    # A folder the user named through TF_XLA_FLAGS too. (JAX passes over
    # an entry it cannot read by itself.)
    set_aside_damaged(settings.directory)
  _chosen[:] = [settings]
  return settings


def chosen():
  """The Settings `prepare` chose in this process, or None if it did not
  run (a test building a plan in process)."""
  return _chosen[0] if _chosen else None


def _usable(folder):
  """Why `folder` cannot hold the cache, or None: TensorFlow fails the
  compile, not just the save, when it cannot write an entry."""
  probe = os.path.join(folder, f'.probe-{os.getpid()}')
  try:
    os.makedirs(folder, exist_ok=True)
    with open(probe, 'w', encoding='utf-8') as f:
      f.write('ok')
    os.remove(probe)
    return None
  except OSError as e:
    line = (f'compile cache off: cannot write {folder} ({e.strerror}); set '
            '--config.compile_cache_dir=DIR or =off')
    logging.warning('%s', line)
    return line


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
