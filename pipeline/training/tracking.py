"""Experiment tracking beside TensorBoard: MLflow and Weights & Biases.

`--config.tracking=mlflow,wandb` (requirements-tracking.txt) names the
trackers; none by default. The chief alone tracks. Each tracker gets the
resolved plan and the config as the run's parameters, every scalar
TensorBoard gets (as 'train/loss', 'eval/accuracy', ...) at its step, and
at the end metrics.json, run.json, the export, run.log and the TensorBoard
events as artifacts. Its run's
id is kept in the workdir (tracking.json), so a resumed run goes on in the
same tracked run. Tracking never stops training: a tracker that fails to
start is one line and is dropped; a failed log is one line the first time.

MLflow logs where MLFLOW_TRACKING_URI points (a server, or ./mlruns);
Weights & Biases as `wandb login` and WANDB_MODE say (offline: files under
the workdir's wandb/, `wandb sync` uploads them later).
"""

import json
import os
import shutil
import time
import uuid

from absl import logging

from pipeline.errors import first_line
from pipeline.rules.config import validation
from pipeline.storage import workdirs

IDS_FILE = workdirs.File.TRACKING
# MLflow's limits: 100 parameters a batch call, 6,000 characters a value.
_MLFLOW_BATCH = 100
_MLFLOW_VALUE_CHARS = 6000


def parameters(plan):
  """The run's parameters: 'config.KEY' and 'plan.KEY', as flat strings."""
  flat = {f'config.{k}': v for k, v in plan.given_config().items()}
  flat.update({f'plan.{k}': v for k, v in plan.to_json().items()})
  return {k: v if isinstance(v, str) else json.dumps(v, default=str)
          for k, v in flat.items()}


class MlflowTracker:
  """An MLflow run through MlflowClient (no global active run)."""
  name = validation.Tracker.MLFLOW

  def __init__(self, plan, run_id):
    # MLflow's own defaults retry a dead server for minutes before the
    # first step; a few seconds tell.
    os.environ.setdefault('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '1')
    os.environ.setdefault('MLFLOW_HTTP_REQUEST_TIMEOUT', '10')
    import mlflow  # pylint: disable=g-import-not-at-top
    from mlflow import entities  # pylint: disable=g-import-not-at-top
    self._entities = entities
    self.client = mlflow.MlflowClient()
    experiment_name = plan.outputs.tracking_project or (
        f'{plan.recipe.model}_{plan.source.name}')
    experiment = self.client.get_experiment_by_name(experiment_name)
    experiment_id = (experiment.experiment_id if experiment else
                     self.client.create_experiment(experiment_name))
    if run_id:
      self.client.update_run(run_id, status='RUNNING')
      self.run_id = run_id
      logged = self.client.get_run(run_id).data.params
    else:
      self.run_id = self.client.create_run(
          experiment_id, run_name=os.path.basename(
              plan.workdir.url.rstrip('/'))).info.run_id
      logged = {}
    # A resumed run's parameters are kept; an accepted change is a tag.
    new = [entities.Param(k, v[:_MLFLOW_VALUE_CHARS])
           for k, v in parameters(plan).items() if k not in logged]
    for start in range(0, len(new), _MLFLOW_BATCH):
      self.client.log_batch(self.run_id,
                            params=new[start:start + _MLFLOW_BATCH])
    for change in plan.accepted_changes:
      self.client.set_tag(self.run_id, f'accepted.{change["key"]}',
                          f'{change["from"]} -> {change["to"]}')

  def log(self, step, values):
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[
        self._entities.Metric(k, float(v), now, step)
        for k, v in values.items()])

  def save(self, path, folder=None):
    if os.path.isdir(path):
      self.client.log_artifacts(self.run_id, path, folder)
    else:
      self.client.log_artifact(self.run_id, path, folder)

  def end(self):
    self.client.set_terminated(self.run_id)


class WandbTracker:
  """A Weights & Biases run, resumed by its id."""
  name = validation.Tracker.WANDB

  def __init__(self, plan, run_id):
    import wandb  # pylint: disable=g-import-not-at-top
    self.wandb = wandb
    self.run = wandb.init(
        project=(plan.outputs.tracking_project or
                 f'{plan.recipe.model}_{plan.source.name}'),
        id=run_id or uuid.uuid4().hex[:8], resume='allow',
        name=os.path.basename(plan.workdir.url.rstrip('/')),
        dir=plan.workdir.path(), config=parameters(plan),
        settings=wandb.Settings(console='off', silent=True))
    self.run_id = self.run.id

  def log(self, step, values):
    self.run.log(dict(values), step=step)

  def save(self, path, folder=None):
    # Copied into the run's files (run.save would link them, and say so on
    # the console): uploaded with the run, or by `wandb sync` offline.
    target = os.path.join(self.run.dir, folder or '')
    if os.path.isdir(path):
      shutil.copytree(path, target, dirs_exist_ok=True)
    else:
      os.makedirs(target, exist_ok=True)
      shutil.copy(path, target)

  def end(self):
    self.run.finish()


TRACKERS = {tracker.name: tracker for tracker in (MlflowTracker, WandbTracker)}


def names(setting):
  """The tracker names a `tracking` setting gives ('' -> [])."""
  return [n.strip() for n in setting.split(',') if n.strip()]


class Tracking:
  """The run's trackers, each kept only while it works."""

  def __init__(self, trackers, workdir):
    self.trackers = trackers
    self.workdir = workdir
    self._failed = set()

  @classmethod
  def start(cls, plan):
    """The chief's trackers, started (or resumed: their ids in the
    workdir); none elsewhere, or without `tracking`."""
    wanted = names(plan.outputs.tracking)
    if not (wanted and plan.hardware.is_chief):
      return cls([], plan.workdir)
    ids = plan.workdir.read_json(IDS_FILE) or {}
    started = []
    for name in wanted:
      try:
        started.append(TRACKERS[name](plan, ids.get(name)))
      except Exception as e:  # pylint: disable=broad-except  # A tracker's own.
        logging.warning('Tracking: %s did not start, and the run goes on '
                        'without it: %s', name, first_line(e))
    for tracker in started:
      logging.info('Tracking: %s run %s%s', tracker.name, tracker.run_id,
                   ' (resumed)' if ids.get(tracker.name) else '')
    if started:
      plan.workdir.write_json(IDS_FILE, dict(
          ids, **{t.name: t.run_id for t in started}))
    return cls(started, plan.workdir)

  def log(self, step, values):
    """Scalars {'train/loss': x, ...} at `step`, to every tracker."""
    self._each('log', step, values)

  def finish(self, relatives):
    """The workdir's files `relatives` (those that exist) as artifacts, then
    each tracked run ended."""
    for relative in relatives:
      path = self.workdir.path(relative)
      if os.path.exists(path):
        self._each('save', path, relative if os.path.isdir(path) else
                   os.path.dirname(relative) or None)
    self._each('end')

  def _each(self, method, *args):
    for tracker in self.trackers:
      try:
        getattr(tracker, method)(*args)
      except Exception as e:  # pylint: disable=broad-except  # A tracker's own.
        if (tracker.name, method) not in self._failed:
          self._failed.add((tracker.name, method))
          logging.warning('Tracking: %s could not %s (the run goes on; '
                          'later failures are not repeated): %s',
                          tracker.name, method, first_line(e))
