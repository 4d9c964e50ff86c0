"""The precision comparison's report: table, notes, JSON and plot.

Reads the finished runs' metrics.json and TensorBoard scalars; writes
comparison.md, comparison.json and comparison.png into the comparison's
root. Running the runs is this package's __init__.
"""

import json
import logging as std_logging
import os
import statistics

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from pipeline.storage import workdirs
from pipeline.errors import UserError
from pipeline.rules.config import validation

ACCURACY = validation.Metric.EVAL_ACCURACY
LOSS = validation.Metric.EVAL_LOSS

BASELINE = 'float32'


def _mean(values):
  values = [v for v in values if v is not None]
  return statistics.fmean(values) if values else None


def summarize(runs, metrics_by_run, examples_per_epoch):
  """One row per policy and trainer: means over its seeds, deltas against
  the same trainer's float32, and ours against Keras' fit's rate."""
  rows = []
  for policy, trainer in dict.fromkeys((r.policy, r.trainer) for r in runs):
    done = [(r, metrics_by_run[r.name]) for r in runs
            if (r.policy, r.trainer) == (policy, trainer) and
            r.name in metrics_by_run]
    if not done:
      continue
    ms = [m for _, m in done]
    rate = _mean(m.get('train_images_per_sec') for m in ms)
    rows.append({
        'policy': policy, 'trainer': trainer,
        'label': policy if trainer == 'ours' else f"{policy}, Keras' fit",
        'seeds': [r.seed for r, _ in done],
        'global_batch_size': done[0][0].global_batch_size,
        'total_steps': ms[0]['total_steps'],
        'examples_seen': ms[0]['total_steps'] * ms[0]['global_batch_size'],
        'images_per_sec': rate,
        'epoch_s': examples_per_epoch / rate if rate else None,
        'compile_s': _mean(m.get('compile_s') for m in ms),
        'peak_memory_bytes': _mean(m.get('peak_memory_bytes') for m in ms),
        'peak_memory_kind': ms[0].get('peak_memory_kind'),
        ACCURACY: _mean(m[ACCURACY] for m in ms),
        f'{ACCURACY}_per_seed': [m[ACCURACY] for m in ms],
        LOSS: _mean(m[LOSS] for m in ms),
        'final_loss_scale': _mean(m.get('final_loss_scale') for m in ms),
        'skipped_steps': (_mean(m.get('skipped_steps') for m in ms)
                          if any(m.get('final_loss_scale') for m in ms)
                          else None),
    })
  ratio = lambda a, b: a / b if a and b else None
  for row in rows:
    base = next((r for r in rows if r['policy'] == BASELINE and
                 r['trainer'] == row['trainer']), None)
    peer = next((r for r in rows if r['policy'] == row['policy'] and
                 r['trainer'] != 'ours'), None)
    row['speedup'] = ratio(row['images_per_sec'],
                           base and base['images_per_sec'])
    row['accuracy_delta_points'] = (
        100 * (row[ACCURACY] - base[ACCURACY]) if base
        else None)
    row['of_keras_fit'] = (ratio(row['images_per_sec'], peer['images_per_sec'])
                           if peer and row['trainer'] == 'ours' else None)
  return rows


def initial_weights(runs, metrics_by_run):
  """{seed: sorted distinct initial-weight digests}: one each means equal."""
  digests = {}
  for run in runs:
    metrics = metrics_by_run.get(run.name)
    if metrics and run.trainer == 'ours':  # Keras' fit keeps no digest.
      digests.setdefault(run.seed, set()).add(
          metrics.get('initial_weights_sha256'))
  return {seed: sorted(d, key=str) for seed, d in digests.items()}


def _cell(value, spec):
  return '-' if value is None else format(value, spec)


_COLUMNS = (
    ('policy', 'label', 's'), ('global batch', 'global_batch_size', 'd'),
    ('steps', 'total_steps', 'd'), ('examples seen', 'examples_seen', ',d'),
    ('images/s', 'images_per_sec', ',.0f'), ('s/epoch', 'epoch_s', '.2f'),
    ('compile s', 'compile_s', '.1f'), ('peak MiB', 'peak_mib', ',.0f'),
    ('eval accuracy', ACCURACY, '.4f'),
    ('eval loss', LOSS, '.4f'),
    ('loss scale', 'final_loss_scale', 'g'),
    ('skipped steps', 'skipped_steps', '.0f'),
    ('speed-up', 'speedup', '.2f'),
    ('accuracy diff (points)', 'accuracy_delta_points', '+.2f'),
    ("of Keras' fit", 'of_keras_fit', '.2f'))


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
  if any(r['trainer'] != 'ours' for r in rows):
    notes.append("Keras' fit: keras.applications' layers trained by "
                 "model.fit on the same input, optimizer, schedule, policy "
                 'and steps per execution; its speed-up and accuracy '
                 "difference are against its own float32; \"of Keras' fit\" "
                 "is this project's rate over it in the same policy. Its "
                 'curves are not plotted (it writes no TensorBoard events).')
  return notes


def write_reports(root, summary):
  """comparison.md and comparison.json in the root."""
  workdirs.write_json(os.path.join(root, 'comparison.json'), summary)
  text = (f'# Precision comparison\n\n{summary["table"]}\n\n' +
          '\n'.join(f'- {n}' for n in summary['notes']) + '\n')
  with open(os.path.join(root, 'comparison.md'), 'w') as f:
    f.write(text)


def read_scalars(folder, tag):
  """[(step, value)] of scalar `tag` in the TensorBoard event files under
  `folder`, read by TensorBoard's own EventAccumulator: where a resumed run
  wrote a step again, the later value is kept, as TensorBoard shows it."""
  # TensorBoard logs each file it finished reading at INFO: not news here.
  std_logging.getLogger('tensorboard').setLevel(std_logging.WARNING)
  accumulator = event_accumulator.EventAccumulator(
      folder, size_guidance={event_accumulator.TENSORS: 0,
                             event_accumulator.SCALARS: 0})
  accumulator.Reload()
  tags = accumulator.Tags()
  if tag in tags[event_accumulator.TENSORS]:  # What tf.summary.scalar writes.
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
            for e in accumulator.Tensors(tag)]
  if tag in tags[event_accumulator.SCALARS]:  # tf.compat.v1 writers.
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]
  return []


def plot(root, runs, metrics_by_run):
  """comparison.png: training loss and eval accuracy against examples seen."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
  for run in runs:
    if run.name not in metrics_by_run or run.trainer != 'ours':
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




def report(request, runs, metrics_by_run, examples_per_epoch, epochs):
  """Writes and prints the comparison of the runs that finished."""
  rows = summarize(runs, metrics_by_run, examples_per_epoch)
  digests = initial_weights(runs, metrics_by_run)
  table = markdown_table(rows)
  notes = _notes(rows, digests, examples_per_epoch, epochs)
  write_reports(request.root, {
      'command': list(request.command),
      'root': request.root,
      'policies': request.policies,
      'seeds': request.seeds,
      'double_batch_16bit': request.double_batch_16bit,
      'epochs': epochs,
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
