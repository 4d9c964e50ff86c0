"""Persistent XLA caches: a machine compiles a program once, not every run.

On an H100 every TensorFlow run spent 2 to 3 minutes in XLA compiling and
autotuning B0's program, in each new process (the driver's PTX cache is not
it). TensorFlow keeps compiled programs across processes with
`--tf_xla_persistent_cache_directory` (TF_XLA_FLAGS) and XLA keeps its GPU
autotuning results with `--xla_gpu_per_fusion_autotune_cache_dir`
(XLA_FLAGS); JAX has its own compilation cache, which holds its autotuning
too. Both flags are read once, as TensorFlow loads, so `prepare` runs
before (from environment.prepare) and the plan only reports it. What the
folder holds and how it is set up is each backend's (Backend.compile_cache).

The folder is per user (~/.cache, never a workdir that others read) and
per software and GPU model, so an entry compiled by another TensorFlow,
cuDNN or GPU is never offered: TensorFlow would fail the run on it, not
recompile. For the same reason a damaged entry is set aside before
TensorFlow can read it (one line), and an unwritable folder turns the cache
off (one line): a failed write fails the compile too.

Importable without TensorFlow or JAX.
"""

import dataclasses
import logging
import os

from pipeline import backends
from pipeline.errors import UserError
from pipeline.storage import user_cache

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


def root():
  """Where compiled programs go unless compile_cache_dir says."""
  return user_cache.folder('xla')


slug = user_cache.slug


def choose(setting, backend, environ, gpus, accelerator, versions):
  """Returns Settings for compile_cache_dir=`setting` ('' picks, 'off', or a
  folder) on `backend` (a backends.interface.Backend). `gpus`: GPU models
  seen; `accelerator`: a TPU or GPU is there; `versions`: the software the
  folder is keyed by, e.g. 'tf-2.21.0'."""
  if setting == 'off':
    return Settings(setting, None, 'compile_cache_dir=off')
  if '://' in setting:
    raise UserError(f'compile_cache_dir={setting}: a local folder, or off '
                    '(compiled programs are per machine)')
  return backend.compile_cache(setting, environ, gpus, accelerator, versions)


def off_on_a_cpu(setting):
  """Settings for a machine without an accelerator and no folder named."""
  return Settings(setting, None, _OFF_ON_A_CPU)


def first_run(setting, keyed_by='software and GPU'):
  where = 'compile_cache_dir' if setting else f'per user, {keyed_by}'
  return (f'{where}; the first run on a machine compiles, for minutes on a '
          'GPU or TPU, later runs load')


def prepare(setting, environ=None, gpus=None, software=None):
  """Chooses and sets up this process's cache in `environ` (os.environ
  unless given), before TensorFlow or JAX load; returns the Settings, also
  kept for `chosen`. `gpus` and `software` stand in for this machine's
  (tests); None looks."""
  environ = os.environ if environ is None else environ
  backend, _ = backends.chosen()
  gpus = backends.gpu_models() if gpus is None else gpus
  settings = choose(setting or '', backend, environ, gpus,
                    bool(gpus) or backends.tpu_attached(),
                    software or backend.software())
  if settings.environment:
    problem = _usable(settings.directory)
    if problem:
      settings = Settings(settings.setting, None, problem)
    else:
      environ.update(settings.environment)
  if settings.directory:
    backend.check_compile_cache(settings.directory)
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
