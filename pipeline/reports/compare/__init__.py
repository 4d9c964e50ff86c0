"""Precision policies side by side: the same model and data under each policy.

run_comparison() trains one run per (policy, seed), each in a fresh process
of `python -m launch.train` (a dtype policy, and the graph rewrite, are
process-global), all from the same seed, split and number of examples (and
with keras_fit, beside each, Keras' own model.fit in a process of
`python -m launch.keras_fit`: keras_fit.py), then
hands the finished runs to report.py, which writes comparison.md,
comparison.json and comparison.png into the root that holds the runs, so
`tensorboard --logdir ROOT` overlays them. launch.compare's other
comparisons: time_to_accuracy.py (fixed against progressive learning) and
race.py (a folder of photographs against keras_peer.py, the code Keras'
example writes).
"""

import dataclasses
import os
import subprocess
import sys
import time

from pipeline.reports.compare import report as comparison_report
from pipeline.rules.speed import precision
from pipeline.data import sources
from pipeline.rules.machine import stopping
from pipeline.storage import workdirs
from pipeline.errors import UserError
from pipeline.rules.speed import step_counts
from pipeline.rules.config import validation
from pipeline.launchers import Launcher
from pipeline import launchers

def parse_seeds(text, default_seed):
  """Seeds from a comma list of integers; '' means [default_seed]."""
  if not text.strip():
    return [default_seed]
  try:
    seeds = [int(s) for s in text.split(',') if s.strip()]
  except ValueError:
    raise UserError(f'--seeds={text!r} must be integers separated by commas, '
                    'e.g. 0,1,2') from None
  if len(set(seeds)) < len(seeds) or not seeds:
    raise UserError(f'--seeds={text!r} must name distinct seeds, e.g. 0,1,2')
  return seeds


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of the comparison."""
  policy: str
  seed: int
  global_batch_size: int
  workdir: str
  trainer: str = 'ours'  # Or KERAS_FIT: Keras' own model.fit.

  @property
  def name(self):
    return os.path.basename(self.workdir)

  @property
  def log_path(self):
    return os.path.join(self.workdir, 'train.log')

  @property
  def metrics_path(self):
    return os.path.join(self.workdir, workdirs.File.METRICS)


# Run.trainer of Keras' own model.fit, and its launcher.
KERAS_FIT = 'keras_fit'


def plan_runs(policies, seeds, global_batch_size, double_batch_16bit, root,
              keras_fit=False):
  """One Run per (policy, seed), and with `keras_fit` Keras' model.fit's
  beside each where the policy is Keras' own; 16-bit policies may get
  twice the batch."""
  runs = []
  for policy in policies:
    # 16 bits: activations take half the memory, so the batch may double.
    batch = global_batch_size * (
        2 if double_batch_16bit and precision.is_16bit(policy) else 1)
    trainers = ['ours'] + ([KERAS_FIT] if keras_fit and
                           precision.keras_policy(policy) == policy else [])
    for seed in seeds:
      name = policy if len(seeds) == 1 else f'{policy}_seed{seed}'
      for trainer in trainers:
        folder = name if trainer == 'ours' else f'{trainer}_{name}'
        runs.append(Run(policy, seed, batch, os.path.join(root, folder),
                        trainer))
  return runs


def child_command(run, forwarded_args, examples_per_epoch, epochs=1):
  """`python -m launch.train` (or launch.keras_fit) for one run; the
  comparison's settings last."""
  own = [f'--workdir={run.workdir}', f'--policy={run.policy}',
         f'--config.seed={run.seed}',
         f'--config.global_batch_size={run.global_batch_size}',
         f'--config.examples_per_epoch={examples_per_epoch}']
  given = lambda key: any(a.startswith(f'--config.{key}')
                          for a in forwarded_args)
  if not given('deterministic_input'):
    # The shuffle and augmentation then follow config.seed alone, so every
    # run sees the examples in the same order.
    own.append('--config.deterministic_input=true')
  if not given('eval_every_epochs'):
    # Four eval points per curve, however long the runs.
    own.append(f'--config.eval_every_epochs={epochs / 4:g}')
  return launchers.command(
      Launcher.TRAIN if run.trainer == 'ours' else Launcher.KERAS_FIT,
      *forwarded_args, *own)


def finished_metrics(run, examples_per_epoch, epochs):
  """The run's metrics.json if it already finished this exact run, else None."""
  metrics = workdirs.read_json(run.metrics_path)
  expected = {'policy': run.policy, 'seed': run.seed,
              'global_batch_size': run.global_batch_size,
              'examples_per_epoch': examples_per_epoch, 'epochs': epochs}
  if (metrics and all(metrics.get(k) == v for k, v in expected.items()) and
      metrics.get('trainer', 'ours') == run.trainer):
    return metrics
  return None


def _last_error_line(log_path):
  try:
    with open(log_path, errors='replace') as f:
      lines = [l.strip() for l in f if l.strip()]
  except OSError:
    return ''
  errors = [l for l in lines if l.startswith('error:')]
  return (errors or lines or [''])[-1]


def train_one(run, command):
  """Runs one child, its output in <run>/train.log; its metrics or None.

  The child has a process group of its own: a stop request (SIGTERM,
  Ctrl-C) reaches it once, passed on from here, and it saves and stops as
  launch.train does. Then this raises Stopped, naming what finished.
  """
  os.makedirs(run.workdir, exist_ok=True)
  with open(run.log_path, 'a') as log:
    log.write(f'$ {" ".join(command)}\n')
    log.flush()
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                             process_group=0)
    with stopping.forwarding_to(child):
      code = child.wait()
  if stopping.requested():
    raise stopping.Stopped(stopping.requested(), f'run {run.name} stopped '
                           f'(exit {code}; log: {run.log_path})')
  metrics = workdirs.read_json(run.metrics_path) if code == 0 else None
  if metrics is None:
    reason = (f'exit {code}' if code else 'no metrics.json written')
    detail = _last_error_line(run.log_path)
    print(f'error: run {run.name} failed ({reason}'
          f'{": " + detail if detail else ""}); log: {run.log_path}',
          file=sys.stderr, flush=True)
  return metrics


@dataclasses.dataclass(frozen=True)
class Request:
  """What launch.compare was asked for."""
  policies: list
  seeds: list
  double_batch_16bit: bool
  root: str
  forwarded_args: list  # --config..., hardware flags: passed to every run.
  command: tuple = ()  # The command line, recorded in comparison.json.
  keras_fit: bool = False  # Keras' own model.fit beside each policy.


def run_comparison(request, config):
  """Trains (or reuses) every run, then writes the reports; True if all ran."""
  if request.root.startswith('gs://'):
    raise UserError(f'--workdir={request.root}: the comparison reads every '
                    "run's files back; use a local directory")
  runs = plan_runs(request.policies, request.seeds, config.global_batch_size,
                   request.double_batch_16bit, request.root, request.keras_fit)
  num_train_examples = (0 if config.examples_per_epoch else
                        sources.load_source(config).num_train_examples)
  examples_per_epoch = step_counts.examples_per_epoch(
      config.examples_per_epoch, num_train_examples,
      [r.global_batch_size for r in runs])
  os.makedirs(request.root, exist_ok=True)
  metrics_by_run = {}
  with stopping.armed():
    _train_all(runs, request, config.epochs, examples_per_epoch,
               metrics_by_run)
  if not metrics_by_run:
    raise UserError(f'no run finished; see the train.log files under '
                    f'{request.root}')

  comparison_report.report(request, runs, metrics_by_run, examples_per_epoch,
                        config.epochs)
  return len(metrics_by_run) == len(runs)


def _train_all(runs, request, epochs, examples_per_epoch, metrics_by_run):
  """Trains or reuses each run in turn, into `metrics_by_run`; a stop
  request stops the run in progress and the comparison, naming what
  finished."""
  for index, run in enumerate(runs, 1):
    label = f'[{index}/{len(runs)}] {run.name}'
    metrics = finished_metrics(run, examples_per_epoch, epochs)
    if metrics:
      print(f'{label}: finished earlier, reusing {run.metrics_path}',
            flush=True)
    else:
      print(f'{label}: training, batch {run.global_batch_size}, '
            f'{examples_per_epoch // run.global_batch_size} steps x '
            f'{epochs} epoch(s); log {run.log_path}', flush=True)
      start = time.perf_counter()
      try:
        metrics = train_one(run, child_command(
            run, request.forwarded_args, examples_per_epoch, epochs))
      except stopping.Stopped as e:
        finished = ', '.join(metrics_by_run) or 'none'
        raise stopping.Stopped(
            e.signum, f'stopped: {stopping.NAMES[e.signum]}: finished runs: '
            f'{finished}; {e}; rerun the same command to go on') from None
      if metrics:
        rate = metrics.get('train_images_per_sec')
        print(f'{label}: done in {time.perf_counter() - start:.0f} s, '
              f'{f"{rate:.0f}" if rate else "-"} img/s, eval accuracy '
              f'{metrics[validation.Metric.EVAL_ACCURACY]:.4f}', flush=True)
    if metrics:
      metrics_by_run[run.name] = metrics
