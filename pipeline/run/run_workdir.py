"""The workdir a run writes, opened and checked before anything trains:
its paths a TPU Node can read, that it takes a write (a bucket's too),
and that it holds this run or none.

"This run" is its recipe: every setting that shapes what it computes (the
data, the model and its sizes, the optimizer and schedule, the batch, the
augmentation, the precision, the seed), compared whole with the run.json
the workdir holds. A rerun of the same command resumes; a changed recipe
is never applied to another run's weights silently. With the default
workdir it trains in a workdir of its own, named by its recipe; with
--workdir it is refused, one line per changed key, unless
--accept_changes names those keys (then run.json records them: raising a
finished run's epochs extends it). A run also resumes only on the backend
that trained it (each resumes from its own checkpoint files).
"""

import dataclasses
import datetime
import hashlib
import json

from absl import logging

from pipeline import backends
from pipeline.data import cache as cache_lib
from pipeline.errors import UserError
from pipeline.recipe import models
from pipeline.run import left_open
from pipeline.rules.config import validation
from pipeline.storage import workdirs

# Config keys that do not shape what a run computes: how often it logs,
# evaluates and checkpoints, what it keeps and exports, how its input is
# fed and its programs compiled, how it recovers. Every other key does,
# and so does the precision policy (RECIPE_POLICY): a key added to
# configs/default.py shapes the result until it is named here.
DOES_NOT_SHAPE_THE_RESULT = frozenset({
    'log_every_steps', 'checkpoint_every_steps', 'keep_checkpoints',
    'keep_best_metric', 'eval_every_epochs', 'export', 'export_tflite',
    'export_onnx', 'tracking', 'tracking_project',
    'profile_steps', 'recovery_max_trials', 'recovery_max_skipped_executions',
    'steps_per_execution', 'compile_cache_dir', 'cache', 'input_pipeline',
    'data_service', 'deterministic_input',
})
# The resolved precision policy, under --policy's name (not a config key).
RECIPE_POLICY = 'policy'
# What no change can be accepted to: another data set or network is
# another run (the checkpoints would not restore).
RUN_IDENTITY = ('dataset', 'model')


@dataclasses.dataclass(frozen=True)
class Change:
  """One setting the workdir's run had another value of."""
  key: str
  old: object
  new: object

  def __str__(self):
    return f'{self.key}={self.old!r}, not {self.new!r}'

  def extends(self):
    """Whether it is a longer run of the same recipe: more epochs."""
    return (self.key == 'epochs' and isinstance(self.old, (int, float))
            and self.new > self.old)

  def to_json(self, when):
    return {'key': self.key, 'from': self.old, 'to': self.new,
            'accepted_at': when}


@dataclasses.dataclass(frozen=True)
class Opened:
  """The run's workdir (None: it writes none), whether it holds this run
  already, and the changes from that run's recipe this one accepted
  (with the earlier runs' accepted ones first, as run.json keeps them)."""
  workdir: workdirs.Workdir = None
  resumed: bool = False
  accepted_changes: tuple = ()


def recipe(config, policy, resolved):
  """The settings that shape the result, as run.json's JSON holds them,
  with the plan's `resolved` values (a Resolved) for the keys the config
  left open."""
  values = {key: value for key, value in config.to_dict().items()
            if key not in DOES_NOT_SHAPE_THE_RESULT}
  values.update(dataclasses.asdict(resolved))
  values[RECIPE_POLICY] = policy
  return json.loads(json.dumps(values, default=str))


def recipe_digest(ours):
  """Eight hex digits that name a recipe (the default workdir of a
  changed one)."""
  text = json.dumps(ours, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:8]


def changes_from(saved, ours, url):
  """The Changes from the run.json `saved` to this run's recipe `ours`
  (resolved, as theirs is read: Resolved.of_record)."""
  theirs = validation.complete(saved['config'], source=f'{url}/run.json')
  # A run.json from before a key was resolved: its config's own values
  # (sizes 0: the network's, as those runs took them).
  sizes = models.image_sizes(theirs.model, theirs.image_size,
                             theirs.eval_image_size)
  resolved = saved.get('resolved', {})
  theirs = recipe(theirs, resolved.get('policy', ours[RECIPE_POLICY]),
                  left_open.Resolved(
                      sizes.train, sizes.eval, theirs.augment,
                      max(theirs.progressive_stages, 0)).recorded(resolved))
  return [Change(key, theirs[key], ours[key]) for key in ours
          if theirs.get(key) != ours[key]]


def check_remote_paths(request, hardware, inputs, cache):
  """A TPU Node's workers read and write only gs://: a one-line UserError
  for a local workdir, input ({config key: path}: sources.inputs) or file
  cache (`cache`, the setting as the input reads it), before any file is
  touched."""
  if hardware.tpu_workers_remote:
    workdirs.check_remote_tpu_paths(
        {**({'workdir': request.workdir} if request.workdir else {}),
         **inputs, **cache_lib.written_paths(cache)})


def open_workdir(config, request, hardware, backend, policy, resolved):
  """The run's Opened workdir, checked (writability, its run's recipe and
  backend). Every process chooses the same workdir (a default one that
  holds another recipe gives way to the recipe's own); the chief alone
  checks and refuses. `resolved`: what the plan chose for the keys the
  config left open (left_open.Resolved). A dry run creates nothing."""
  if request.workdir is None:
    return Opened()
  _check_accepted_keys(request.accept_changes, tuple(config))
  ours = recipe(config, policy, resolved)
  url = request.workdir
  if request.trains and request.default_workdir:
    url = _default_workdir_of(url, ours, request)
  workdir = _workdir(url, request)
  if not hardware.is_chief:
    return Opened(workdir)
  # For gs://: bucket exists and takes a write, or one line.
  workdir.check(create=not request.dry_run)
  saved = check_same_run(workdir, ours, backend if request.trains else None)
  if not saved:
    return Opened(workdir)
  if not request.trains:  # launch.evaluate: the run's config, overridden.
    return Opened(workdir, True)
  accepted = _accepted(workdir, saved,
                       changes_from(saved, ours, workdir.url),
                       request.accept_changes)
  return Opened(workdir, True, accepted)


def check_same_run(workdir, ours, backend=None):
  """The run.json of the run the workdir holds (None: none), checked
  against this run's recipe `ours` and the backend: a one-line UserError if the `backend` that would resume it
  is not the one that trained it (each resumes from its own checkpoint
  files, and the other's would be passed over and the run start again),
  or if it holds another data set or network (RUN_IDENTITY)."""
  saved = workdir.read_json(workdirs.File.RUN)
  if not saved:
    return None
  for key in RUN_IDENTITY:
    if saved['config'].get(key, ours[key]) != ours[key]:
      raise UserError(
          f'workdir {workdir.url!r} holds a run with {key}='
          f'{saved["config"][key]!r}, not {ours[key]!r}; use another '
          '--workdir to start a new run')
  trained_on = backends.trained_on(saved.get('resolved', {}))
  if backend and trained_on is not backend:
    raise UserError(
        f'workdir {workdir.url!r} holds a run trained on {trained_on.name}, '
        f'which resumes there only: --backend={trained_on.name}, or another '
        '--workdir')
  return saved


def _accepted(workdir, saved, changes, accept):
  """The changes run.json will record (its own first), once each change is
  accepted by name; else one line per change and the two ways on."""
  refused = [change for change in changes if change.key not in accept]
  if refused:
    keys = ','.join(change.key for change in refused)
    lines = [f'workdir {workdir.url!r} holds a run with {change}'
             + (' (raising it extends that run)' if change.extends() else '')
             for change in refused]
    lines[-1] += (f'; to start a new run use another --workdir, or to '
                  f'train this one on under the new values (recorded in '
                  f'run.json) --accept_changes={keys}')
    raise UserError('\nerror: '.join(lines))
  finished = _finished(workdir, saved)
  if finished and changes and not any(change.extends() for change in changes):
    raise UserError(
        f'workdir {workdir.url!r} holds a finished run: nothing is left to '
        f'train under {", ".join(f"{c.key}={c.new!r}" for c in changes)}; '
        'use another --workdir for a new run, or raise --config.epochs '
        '(with --accept_changes=epochs) to train this one longer')
  when = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')
  for change in changes:
    print_accepted(workdir.url, change, finished)
  return (*saved.get('accepted_changes', ()),
          *(change.to_json(when) for change in changes))


def _finished(workdir, saved):
  """Whether the workdir's run (its run.json, `saved`) trained to its end:
  its metrics.json counts the steps its run.json plans."""
  metrics = workdir.read_json(workdirs.File.METRICS)
  return bool(metrics) and metrics.get('total_steps') == saved.get(
      'resolved', {}).get('total_steps')


def print_accepted(url, change, finished):
  """The log line of one accepted change."""
  if change.extends():
    logging.info('Accepted: epochs %s -> %s extends the %srun in %s from its '
                 'last checkpoint, on the schedule of a %s-epoch run from '
                 'there (a cosine or linear rate rises again to that run\'s '
                 'at this step, then decays to 0 at its end)', change.old,
                 change.new, 'finished ' if finished else '', url, change.new)
  else:
    logging.info('Accepted: %s %r -> %r for the run in %s from its last '
                 'checkpoint on (recorded in run.json)', change.key,
                 change.old, change.new, url)


def _default_workdir_of(url, ours, request):
  """The default workdir, or where it holds another recipe, the recipe's
  own beside it (URL-rDIGEST), said with why."""
  saved = _workdir(url, request).read_json(workdirs.File.RUN)
  if not saved:
    return url
  changes = [change for change in changes_from(saved, ours, url)
             if change.key not in request.accept_changes]
  if not changes:
    return url
  own = f'{url}-r{recipe_digest(ours)}'
  logging.info('Workdir: %s holds another recipe (%s); this one trains in %s '
               '(--workdir=%s --accept_changes=%s trains that run on instead)',
               url, '; '.join(map(str, changes)), own, url,
               ','.join(change.key for change in changes))
  return own


def _check_accepted_keys(keys, settings):
  """A one-line UserError for an --accept_changes key that no change could
  name (`settings`: the config's keys)."""
  for key in keys:
    if key in RUN_IDENTITY:
      raise UserError(f'--accept_changes={key}: a run cannot change its '
                      f'{key} (its checkpoints would not restore); use '
                      'another --workdir')
    if key != RECIPE_POLICY and key not in settings:
      raise UserError(f'--accept_changes names {key!r}, no setting; '
                      'accepted: the keys of configs/default.py, or '
                      f'{RECIPE_POLICY}')


def _workdir(url, request):
  return workdirs.Workdir(url, request.staging_dir,
                          lease_s=request.workdir_lease_s)
