"""Precision policies side by side: the same model and data under each policy.

run_comparison() trains one run per (policy, seed), each in a fresh process
of `python -m launch.train` (a dtype policy, and the graph rewrite, are
process-global), all from the same seed, split and number of examples, and
writes comparison.md, comparison.json and comparison.png into the root that
holds the runs, so `tensorboard --logdir ROOT` overlays them.
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from pipeline import data
from pipeline import precision
from pipeline import storage
from pipeline.errors import UserError

BASELINE = 'float32'
# Compute in 16 bits: activations take half the memory, so the batch may
# double (--double_batch_16bit).
SIXTEEN_BIT = ('mixed_float16', 'mixed_bfloat16', 'float16', 'bfloat16',
               precision.REWRITE)
ACCEPTED = tuple(p for p in precision.POLICIES if p != 'auto')


def parse_policies(text):
  """Policy names from a comma list, each checked; one-line UserError."""
  names = [n.strip() for n in text.split(',') if n.strip()]
  if not names:
    raise UserError(f'--policies={text!r} names no policy; accepted: '
                    f'{", ".join(ACCEPTED)}')
  for name in names:
    if name == 'auto':
      raise UserError("--policies: 'auto' picks a different policy per "
                      'device; name the policies to compare, e.g. '
                      'float32,mixed_bfloat16')
    if name not in ACCEPTED:
      raise UserError(f'--policies: unknown policy {name!r}; accepted: '
                      f'{", ".join(ACCEPTED)}')
  if len(set(names)) < len(names):
    raise UserError(f'--policies={text!r} names a policy twice')
  return names


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

  @property
  def name(self):
    return os.path.basename(self.workdir)

  @property
  def log_path(self):
    return os.path.join(self.workdir, 'train.log')

  @property
  def metrics_path(self):
    return os.path.join(self.workdir, 'metrics.json')


def plan_runs(policies, seeds, global_batch_size, double_batch_16bit, root):
  """One Run per (policy, seed); 16-bit policies may get twice the batch."""
  runs = []
  for policy in policies:
    batch = global_batch_size * (
        2 if double_batch_16bit and policy in SIXTEEN_BIT else 1)
    for seed in seeds:
      name = policy if len(seeds) == 1 else f'{policy}_seed{seed}'
      runs.append(Run(policy, seed, batch, os.path.join(root, name)))
  return runs


def common_examples_per_epoch(requested, num_train_examples, batch_sizes):
  """Examples per epoch that every run's global batch divides.

  `requested` (the config's examples_per_epoch) if set; otherwise the
  largest multiple of the biggest batch that fits in the training set.
  """
  if requested:
    for batch in batch_sizes:
      if requested % batch:
        raise UserError(f'examples_per_epoch={requested} is not a multiple '
                        f'of global batch {batch}; use a multiple of '
                        f'{max(batch_sizes)}')
    return requested
  biggest = max(batch_sizes)
  examples = num_train_examples // biggest * biggest
  if not examples:
    raise UserError(f'global batch {biggest} is larger than the '
                    f'{num_train_examples} training examples')
  for batch in batch_sizes:
    if examples % batch:  # Only when batches are not multiples of each other.
      raise UserError(f'global batches {sorted(set(batch_sizes))} have no '
                      'common multiple that fits the training set; set '
                      '--config.examples_per_epoch')
  return examples


# launch.compare's flags and those it sets per run: never passed through.
_OWN_FLAGS = ('policies', 'seeds', 'workdir', 'policy')
_OWN_BOOL_FLAGS = ('double_batch_16bit', 'nodouble_batch_16bit', 'dry_run',
                   'nodry_run')


def forwarded_args(argv):
  """argv without the comparison's own flags: what every run is given."""
  kept, skip_value = [], False
  for arg in argv:
    if skip_value:
      skip_value = False
      continue
    name = arg.lstrip('-').split('=', 1)[0]
    if arg.startswith('-') and name in _OWN_FLAGS + _OWN_BOOL_FLAGS:
      # '--workdir PATH': the value is the next argument.
      skip_value = '=' not in arg and name in _OWN_FLAGS
      continue
    kept.append(arg)
  return kept


def child_command(run, forwarded_args, examples_per_epoch):
  """`python -m launch.train` for one run; the comparison's settings last."""
  own = [f'--workdir={run.workdir}', f'--policy={run.policy}',
         f'--config.seed={run.seed}',
         f'--config.global_batch_size={run.global_batch_size}',
         f'--config.examples_per_epoch={examples_per_epoch}']
  if not any(a.startswith('--config.deterministic_input')
             for a in forwarded_args):
    # The shuffle and augmentation then follow config.seed alone, so every
    # run sees the examples in the same order.
    own.append('--config.deterministic_input=true')
  return [sys.executable, '-m', 'launch.train', *forwarded_args, *own]


def finished_metrics(run, examples_per_epoch, epochs):
  """The run's metrics.json if it already finished this exact run, else None."""
  metrics = storage.read_json(run.metrics_path)
  expected = {'policy': run.policy, 'seed': run.seed,
              'global_batch_size': run.global_batch_size,
              'examples_per_epoch': examples_per_epoch, 'epochs': epochs}
  if metrics and all(metrics.get(k) == v for k, v in expected.items()):
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
  """Runs one child, its output in <run>/train.log; its metrics or None."""
  os.makedirs(run.workdir, exist_ok=True)
  with open(run.log_path, 'a') as log:
    log.write(f'$ {" ".join(command)}\n')
    log.flush()
    code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
  metrics = storage.read_json(run.metrics_path) if code == 0 else None
  if metrics is None:
    reason = (f'exit {code}' if code else 'no metrics.json written')
    detail = _last_error_line(run.log_path)
    print(f'error: run {run.name} failed ({reason}'
          f'{": " + detail if detail else ""}); log: {run.log_path}',
          file=sys.stderr, flush=True)
  return metrics


def _mean(values):
  values = [v for v in values if v is not None]
  return statistics.fmean(values) if values else None


def summarize(runs, metrics_by_run, examples_per_epoch):
  """One row per policy: means over its seeds, and deltas against float32."""
  rows = []
  for policy in dict.fromkeys(r.policy for r in runs):
    done = [(r, metrics_by_run[r.name]) for r in runs
            if r.policy == policy and r.name in metrics_by_run]
    if not done:
      continue
    ms = [m for _, m in done]
    rate = _mean(m.get('train_images_per_sec') for m in ms)
    rows.append({
        'policy': policy,
        'seeds': [r.seed for r, _ in done],
        'global_batch_size': done[0][0].global_batch_size,
        'total_steps': ms[0]['total_steps'],
        'examples_seen': ms[0]['total_steps'] * ms[0]['global_batch_size'],
        'images_per_sec': rate,
        'epoch_s': examples_per_epoch / rate if rate else None,
        'compile_s': _mean(m.get('compile_s') for m in ms),
        'peak_memory_bytes': _mean(m.get('peak_memory_bytes') for m in ms),
        'peak_memory_kind': ms[0].get('peak_memory_kind'),
        'eval_accuracy': _mean(m['eval_accuracy'] for m in ms),
        'eval_accuracy_per_seed': [m['eval_accuracy'] for m in ms],
        'eval_loss': _mean(m['eval_loss'] for m in ms),
        'final_loss_scale': _mean(m.get('final_loss_scale') for m in ms),
        'skipped_steps': (_mean(m.get('skipped_steps') for m in ms)
                          if any(m.get('final_loss_scale') for m in ms)
                          else None),
    })
  base = next((r for r in rows if r['policy'] == BASELINE), None)
  for row in rows:
    row['speedup'] = (row['images_per_sec'] / base['images_per_sec']
                      if base and row['images_per_sec'] and
                      base['images_per_sec'] else None)
    row['accuracy_delta_points'] = (
        100 * (row['eval_accuracy'] - base['eval_accuracy']) if base
        else None)
  return rows


def initial_weights(runs, metrics_by_run):
  """{seed: sorted distinct initial-weight digests}: one each means equal."""
  digests = {}
  for run in runs:
    metrics = metrics_by_run.get(run.name)
    if metrics:
      digests.setdefault(run.seed, set()).add(
          metrics.get('initial_weights_sha256'))
  return {seed: sorted(d, key=str) for seed, d in digests.items()}


def _cell(value, spec):
  return '-' if value is None else format(value, spec)


_COLUMNS = (
    ('policy', 'policy', 's'), ('global batch', 'global_batch_size', 'd'),
    ('steps', 'total_steps', 'd'), ('examples seen', 'examples_seen', ',d'),
    ('images/s', 'images_per_sec', ',.0f'), ('s/epoch', 'epoch_s', '.2f'),
    ('compile s', 'compile_s', '.1f'), ('peak MiB', 'peak_mib', ',.0f'),
    ('eval accuracy', 'eval_accuracy', '.4f'),
    ('eval loss', 'eval_loss', '.4f'),
    ('loss scale', 'final_loss_scale', 'g'),
    ('skipped steps', 'skipped_steps', '.0f'),
    ('speed-up', 'speedup', '.2f'),
    ('accuracy diff (points)', 'accuracy_delta_points', '+.2f'))


def markdown_table(rows):
  """The side-by-side table as Markdown."""
  lines = ['| ' + ' | '.join(c[0] for c in _COLUMNS) + ' |',
           '|' + ' --- |' * len(_COLUMNS)]
  for row in rows:
    row = dict(row, peak_mib=(row['peak_memory_bytes'] / 2**20
                              if row['peak_memory_bytes'] else None))
    lines.append('| ' + ' | '.join(_cell(row[key], spec)
                                   for _, key, spec in _COLUMNS) + ' |')
  return '\n'.join(lines)


def _notes(rows, digests, examples_per_epoch, epochs):
  """The lines under the table: what was equal, what the figures mean."""
  seeds = sorted(digests)
  equal = all(len(d) == 1 for d in digests.values())
  memory_kind = next((r['peak_memory_kind'] for r in rows
                      if r['peak_memory_kind']), 'unknown')
  notes = [
      f'Every run: {epochs} epoch(s) of {examples_per_epoch} examples; '
      f'seed(s) {", ".join(map(str, seeds))}'
      + (' (figures are means over seeds).' if len(seeds) > 1 else '.'),
      'Initial weights: ' + (
          'identical across policies for each seed (sha256 '
          + ', '.join(f'{s}: {d[0][:12]}' for s, d in sorted(digests.items()))
          + ').' if equal else
          'DIFFER across policies: ' + json.dumps(digests) + '.'),
      'images/s is steady-state training (the first, compiling execution '
      'excluded); s/epoch = examples per epoch / images/s; compile s is the '
      f'first execution. Peak memory is the {memory_kind} peak of each run\'s '
      'process.',
  ]
  if not any(r['policy'] == BASELINE for r in rows):
    notes.append('No float32 run: speed-up and accuracy difference are not '
                 'computed.')
  return notes


def write_reports(root, summary):
  """comparison.md and comparison.json in the root."""
  storage.write_json(os.path.join(root, 'comparison.json'), summary)
  text = (f'# Precision comparison\n\n{summary["table"]}\n\n' +
          '\n'.join(f'- {n}' for n in summary['notes']) + '\n')
  with open(os.path.join(root, 'comparison.md'), 'w') as f:
    f.write(text)


def read_scalars(folder, tag):
  """[(step, value)] for scalar `tag` in the event files under `folder`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  values = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(folder, 'events.*'))):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag != tag:
          continue
        # tf.summary.scalar writes tensor events; older writers simple_value.
        number = (float(tf.make_ndarray(value.tensor))
                  if value.HasField('tensor') else value.simple_value)
        values[event.step] = number  # A resumed run rewrites a step: last wins.
  return sorted(values.items())


def plot(root, runs, metrics_by_run):
  """comparison.png: training loss and eval accuracy against examples seen."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
  for run in runs:
    if run.name not in metrics_by_run:
      continue
    batch = metrics_by_run[run.name]['global_batch_size']
    board = os.path.join(run.workdir, 'tensorboard')
    for axes, split, tag in ((loss_axes, 'train', 'loss'),
                             (accuracy_axes, 'eval', 'accuracy')):
      points = read_scalars(os.path.join(board, split), tag)
      if not points:
        raise UserError(f'run {run.name} has no {split} {tag!r} scalars under '
                        f'{board}; rerun the comparison to retrain it')
      steps, values = zip(*points)
      axes.plot([s * batch for s in steps], values, marker='o', markersize=3,
                label=run.name)
  loss_axes.set(title='training loss', xlabel='examples seen', ylabel='loss')
  accuracy_axes.set(title='eval accuracy', xlabel='examples seen',
                    ylabel='accuracy')
  for axes in (loss_axes, accuracy_axes):
    axes.grid(alpha=0.3)
    axes.legend()
  figure.tight_layout()
  path = os.path.join(root, 'comparison.png')
  figure.savefig(path, dpi=100)
  plt.close(figure)
  return path


@dataclasses.dataclass(frozen=True)
class Request:
  """What launch.compare was asked for."""
  policies: list
  seeds: list
  double_batch_16bit: bool
  root: str
  forwarded_args: list  # --config..., hardware flags: passed to every run.
  command: tuple = ()  # The command line, recorded in comparison.json.


def run_comparison(request, config):
  """Trains (or reuses) every run, then writes the reports; True if all ran."""
  if request.root.startswith('gs://'):
    raise UserError(f'--workdir={request.root}: the comparison reads every '
                    "run's files back; use a local directory")
  runs = plan_runs(request.policies, request.seeds, config.global_batch_size,
                   request.double_batch_16bit, request.root)
  num_train_examples = (0 if config.examples_per_epoch else
                        data.load_source(config).num_train_examples)
  examples_per_epoch = common_examples_per_epoch(
      config.examples_per_epoch, num_train_examples,
      [r.global_batch_size for r in runs])
  os.makedirs(request.root, exist_ok=True)
  metrics_by_run = {}
  for index, run in enumerate(runs, 1):
    label = f'[{index}/{len(runs)}] {run.name}'
    metrics = finished_metrics(run, examples_per_epoch, config.epochs)
    if metrics:
      print(f'{label}: finished earlier, reusing {run.metrics_path}',
            flush=True)
    else:
      print(f'{label}: training, batch {run.global_batch_size}, '
            f'{examples_per_epoch // run.global_batch_size} steps x '
            f'{config.epochs} epoch(s); log {run.log_path}', flush=True)
      start = time.perf_counter()
      metrics = train_one(run, child_command(run, request.forwarded_args,
                                             examples_per_epoch))
      if metrics:
        rate = metrics.get('train_images_per_sec')
        print(f'{label}: done in {time.perf_counter() - start:.0f} s, '
              f'{f"{rate:.0f}" if rate else "-"} img/s, eval accuracy '
              f'{metrics["eval_accuracy"]:.4f}', flush=True)
    if metrics:
      metrics_by_run[run.name] = metrics
  if not metrics_by_run:
    raise UserError(f'no run finished; see the train.log files under '
                    f'{request.root}')

  rows = summarize(runs, metrics_by_run, examples_per_epoch)
  digests = initial_weights(runs, metrics_by_run)
  table = markdown_table(rows)
  notes = _notes(rows, digests, examples_per_epoch, config.epochs)
  write_reports(request.root, {
      'command': list(request.command),
      'root': request.root,
      'policies': request.policies,
      'seeds': request.seeds,
      'double_batch_16bit': request.double_batch_16bit,
      'epochs': config.epochs,
      'examples_per_epoch': examples_per_epoch,
      'baseline': BASELINE,
      'initial_weights_identical': all(len(d) == 1 for d in digests.values()),
      'initial_weights_sha256': {str(s): d for s, d in digests.items()},
      'rows': rows,
      'runs': [dict(name=r.name, policy=r.policy, seed=r.seed,
                    workdir=r.workdir, log=r.log_path,
                    metrics=metrics_by_run.get(r.name)) for r in runs],
      'failed': [r.name for r in runs if r.name not in metrics_by_run],
      'table': table,
      'notes': notes,
  })
  png = plot(request.root, runs, metrics_by_run)
  print('\n' + table + '\n\n' + '\n'.join(notes))
  print(f'\nWrote {os.path.join(request.root, "comparison.md")}, '
        f'comparison.json and {png}')
  print(f'TensorBoard over all runs: tensorboard --logdir {request.root}')
  return len(metrics_by_run) == len(runs)
