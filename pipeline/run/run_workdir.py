"""The workdir a run writes, opened and checked before anything trains:
its paths a TPU Node can read, that it takes a write (a bucket's too),
and that it holds this run or none: the same data, network and size, on
the backend that trained it (each resumes from its own checkpoint files).
"""

from pipeline import backends
from pipeline.data import sources
from pipeline.errors import UserError
from pipeline.storage import workdirs

# Fields that must match for a workdir's checkpoints to be restorable.
RUN_IDENTITY = ('dataset', 'model', 'image_size')


def open_workdir(config, request, hardware, backend):
  """The run's Workdir, checked (TPU Node paths, writability, identity),
  and whether it holds this run already (None, False: no workdir)."""
  if request.workdir is None:
    return None, False
  if hardware.tpu_workers_remote:
    workdirs.check_remote_tpu_paths(config, request.workdir,
                                    sources.of(config).inputs(config))
  workdir = workdirs.Workdir(request.workdir, request.staging_dir,
                            lease_s=request.workdir_lease_s)
  if hardware.is_chief:
    workdir.check()  # For gs://: bucket exists and takes a write, or one line.
    return workdir, check_same_run(workdir, config,
                                   backend if request.trains else None)
  return workdir, False


def check_same_run(workdir, config, backend=None):
  """A one-line UserError if the workdir holds another run, or (given the
  `backend` that would resume it) this one trained on the other backend:
  each resumes from its own checkpoint files, and the other's would be
  passed over and the run start again. Whether it holds this run."""
  saved = workdir.read_json('run.json')
  if not saved:
    return False
  for key in RUN_IDENTITY:
    if saved['config'].get(key) != config[key]:
      raise UserError(
          f'workdir {workdir.url!r} holds a run with {key}='
          f'{saved["config"].get(key)!r}, not {config[key]!r}; use another '
          '--workdir to start a new run')
  trained_on = backends.trained_on(saved.get('resolved', {}))
  if backend and trained_on is not backend:
    raise UserError(
        f'workdir {workdir.url!r} holds a run trained on {trained_on.name}, '
        f'which resumes there only: --backend={trained_on.name}, or another '
        '--workdir')
  return True
