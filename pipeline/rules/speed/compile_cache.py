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


def chosen():
  """The Settings run.environment chose in this process (`keep`), or None
  if it did not run (a test building a plan in process)."""
  return _chosen[0] if _chosen else None


def chosen_for(setting):
  """chosen(), which the config's compile_cache_dir `setting` must agree
  with: XLA reads it as the framework loads, before a config file is."""
  settings = chosen()
  if settings and setting != settings.setting:
    raise UserError(
        f'compile_cache_dir={setting!r} came from a config file; XLA reads '
        'it as TensorFlow loads, before configs are: give it on the command '
        f'line, --config.compile_cache_dir={setting}')
  return settings


def keep(settings):
  _chosen[:] = [settings]
