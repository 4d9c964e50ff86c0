"""Evaluation on its own: a run's committed checkpoint on a held-out split.

`run_config` reads the run's own config from its run.json (overrides such
as another eval split or TFRecord glob on top); an `Evaluator` restores
committed checkpoints read-only (it never writes, prunes or cleans
checkpoints), evaluates one, or follows a running job's as they commit, and
writes `evaluation/<split>-step<N>.json` and `.png` into the workdir: loss,
accuracy, top-5, per-class accuracy and the confusion matrix (for many
classes the most-confused pairs are drawn).
"""

import functools
import os
import re
import time

from absl import logging
import numpy as np
import tensorflow as tf

from pipeline.data import inputs
from pipeline.reports import export
from pipeline.rules.machine import stopping
from pipeline.storage import checkpoint_format
from pipeline.storage import workdirs
from pipeline.rules.config import validation
from pipeline.storage.checkpoint import Checkpointer
from pipeline.errors import UserError

# Up to this many classes the picture is the whole confusion matrix.
_MATRIX_CLASSES = 20
_PAIRS = 20  # Otherwise: the most-confused (true, predicted) pairs.


def run_config(url, staging_dir, overrides):
  """The config a run trained with (its run.json), with `overrides` on top.

  Returns (config, the run's resolved policy, the format of its
  checkpoints, storage.checkpoint_format's: None for a run.json from
  before it named one).
  `overrides` are --config.KEY=VALUE values, whose keys the flag parser
  already checked.
  """
  saved = workdirs.Workdir(url, staging_dir).read_json(workdirs.File.RUN)
  if not saved:
    raise UserError(f'{url} holds no run (no run.json); pass the --workdir '
                    'of a run of launch.train')
  # A run.json from before a key existed gets that key's default. Where
  # this machine keeps compiled programs is this command's, not the run's:
  # configs/default.py's, unless given here.
  theirs = {key: value for key, value in saved['config'].items()
            if key != 'compile_cache_dir'}
  resolved = saved['resolved']
  # What the run chose for the keys its config left open (its sizes, its
  # augmentation), as it trained: not chosen again from the data.
  theirs.update({key: resolved[key] for key in
                 ('image_size', 'eval_image_size', 'augment')
                 if not theirs.get(key) and resolved.get(key)})
  config = validation.complete(dict(theirs, **overrides),
                               source=f'{url}/run.json')
  try:
    written_as = checkpoint_format.of_run(resolved)
  except ValueError as e:
    raise UserError(f'{url}/run.json: {e}') from None
  return config, resolved['policy'], written_as


class Evaluator:
  """A run's model, restored read-only from its committed checkpoints.

  As a worker that is not the chief: it reads the run's checkpoints, never
  finishes uploads, prunes or deletes anything, and writes only into
  `evaluation/` and `tensorboard/evaluator/`.
  """

  def __init__(self, plan, written_as=None):
    """`written_as`: the run's checkpoint Format (run_config's); None:
    the one its files are in."""
    self.plan = plan
    self.trainer = plan.backend.build_trainer(plan)
    trainer = self.trainer
    self.checkpointer = Checkpointer(
        plan.workdir, plan.outputs.keep_checkpoints, is_chief=False,
        if_missing={'ema': lambda path: trainer.ema.reset()},
        files=functools.partial(
            trainer.checkpoint_files,
            written_as=written_as))
    batch = plan.global_batch_size
    self.dataset = plan.backend.distribute(plan.hardware,
                                           inputs.eval_input(plan))
    self.num_steps = inputs.eval_steps(plan.source, batch)

  def evaluate(self, step=None):
    """Evaluates the newest committed checkpoint (or `step`); the report."""
    step = (self.checkpointer.restore_step(step) if step is not None else
            self.checkpointer.restore_latest())
    if step is None:
      raise UserError(f'{self.plan.workdir.url} has no committed checkpoint '
                      'yet')
    result = self.trainer.evaluate(self.dataset, self.num_steps)
    report = make_report(result, step, self.plan.source,
                         split_name(self.plan.held_out))
    if self.plan.hardware.is_chief:
      write(report, self.plan.workdir)
    return report

  def export(self, name):
    """Exports the checkpoint evaluate() restored into `<workdir>/<name>`,
    on this process's backend: the SavedModel, metadata.json and LiteRT
    model launch.train writes, so a run trained on one backend is exported
    on the other. A name of its own: never the run's `export`, which the
    run that holds the workdir may be writing."""
    check_export_name(name)
    return export.export_run(self.plan, self.trainer, name)

  def follow(self, poll_s, timeout_s, clock=time.monotonic):
    """Evaluates each new committed checkpoint once, until the final step's.

    Polls every `poll_s`; stops after `timeout_s` without a new one. A
    checkpoint pruned or damaged while it is read is skipped with one line.
    Scalars go to tensorboard/evaluator, beside the trainer's curves.
    Returns the reports. SIGTERM or Ctrl-C stops it between checkpoints
    (stopping.Stopped, naming those evaluated).
    """
    with stopping.armed():
      return self._follow(poll_s, timeout_s, clock)

  def _follow(self, poll_s, timeout_s, clock):
    workdir, total = self.plan.workdir, self.plan.total_steps
    writer = tf.summary.create_file_writer(
        workdir.path('tensorboard', 'evaluator'))
    seen, reports = set(), []
    last_new = clock()
    while True:
      for step in [s for s in self.checkpointer.committed_steps()
                   if s not in seen]:
        _raise_if_asked_to_stop(workdir, reports)
        seen.add(step)
        last_new = clock()
        try:
          report = self.evaluate(step)
        except UserError as e:  # Pruned or damaged under our feet.
          logging.warning('Skipped checkpoint %d: %s', step, e)
          continue
        reports.append(report)
        logging.info('%s', summary_lines(report)[0])
        with writer.as_default(step=step):
          for key in ('accuracy', 'loss', 'top5_accuracy'):
            if report[key] is not None:
              tf.summary.scalar(key, report[key])
        writer.flush()
        workdir.publish('tensorboard/evaluator')
      if total in seen:
        logging.info('Evaluated the final step %d; stopping', total)
        return reports
      if clock() - last_new > timeout_s:
        logging.warning('No new checkpoint in %.0f s; stopping (the run is '
                        'at most at step %s of %d)', timeout_s,
                        max(seen, default='none'), total)
        return reports
      stopping.wait(poll_s)
      _raise_if_asked_to_stop(workdir, reports)


def _raise_if_asked_to_stop(workdir, reports):
  """Stopped, naming what was evaluated, once SIGTERM or Ctrl-C came."""
  signum = stopping.requested()
  if signum:
    steps = ', '.join(str(r['step']) for r in reports) or 'none'
    raise stopping.Stopped(
        signum, f'stopped: {stopping.NAMES[signum]}: evaluated '
        f'{len(reports)} checkpoint(s) of {workdir.url}, steps {steps}')


def check_export_name(name):
  """Evaluator.export's folder: a name of its own, beside the run's."""
  if not re.fullmatch(r'export-[\w.-]+', name):
    raise UserError(f'--export={name}: give a folder name that starts with '
                    '"export-", such as export-tensorflow')


def split_name(split):
  """A file-name-safe name of the split evaluated (a source's held_out)."""
  return re.sub(r'[^\w.-]+', '_', split).strip('_') or 'eval'


def make_report(result, step, source, split):
  """The evaluation as a JSON-ready dict."""
  confusion = np.asarray(result['confusion'])
  totals = confusion.sum(axis=1)
  per_class = {source.class_name(i): (float(confusion[i, i] / totals[i])
                                      if totals[i] else None)
               for i in range(source.num_classes)}
  off_diagonal = confusion.copy()
  np.fill_diagonal(off_diagonal, 0)
  order = np.argsort(off_diagonal, axis=None)[::-1][:_PAIRS]
  pairs = [{'true': source.class_name(int(t)),
            'predicted': source.class_name(int(p)),
            'count': int(off_diagonal[t, p])}
           for t, p in zip(*np.unravel_index(order, confusion.shape))
           if off_diagonal[t, p]]
  return {
      'step': step,
      'dataset': source.name,
      'split': split,
      'examples': int(result['examples']),
      'loss': result['loss'],
      'accuracy': result['accuracy'],
      'top5_accuracy': (result['top5_accuracy'] if source.num_classes > 5
                        else None),
      # With a moving average, the figures above are its weights' (what is
      # exported); this is the model's own.
      'accuracy_raw': result.get('accuracy_raw'),
      'per_class_accuracy': per_class,
      'most_confused': pairs,
      'class_names': [source.class_name(i) for i in range(source.num_classes)],
      'confusion_matrix': confusion.astype(int).tolist(),
  }


def write(report, workdir):
  """evaluation/<split>-step<N>.json and .png, written whole; returns the stem."""
  stem = f'evaluation/{report["split"]}-step{report["step"]}'
  os.makedirs(workdir.path('evaluation'), exist_ok=True)
  workdirs.write_json(workdir.path(f'{stem}.json'), report)
  plot(report, workdir.path(f'{stem}.png'))
  workdir.publish('evaluation')
  logging.info('Wrote %s.json and .png', f'{workdir.url}/{stem}')
  return stem


def plot(report, path):
  """The confusion matrix, or for many classes the most-confused pairs."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = report['class_names']
  title = (f'{report["dataset"]} {report["split"]}, step {report["step"]}: '
           f'accuracy {report["accuracy"]:.4f}')
  if len(names) <= _MATRIX_CLASSES:
    matrix = np.asarray(report['confusion_matrix'])
    # Room for the longest name beside and below the matrix.
    figure, axes = plt.subplots(figsize=(
        1.5 + 0.5 * len(names) + 0.07 * max(map(len, names)),) * 2)
    axes.imshow(matrix, cmap='Blues')
    for (t, p), count in np.ndenumerate(matrix):
      if count:
        axes.text(p, t, str(count), ha='center', va='center', fontsize=8,
                  color='white' if count > matrix.max() / 2 else 'black')
    axes.set(xticks=range(len(names)), yticks=range(len(names)),
             xticklabels=names, yticklabels=names, xlabel='predicted',
             ylabel='true')
    # Long names slanted, anchored at their ends: they never overlap.
    plt.setp(axes.get_xticklabels(), rotation=45, ha='right',
             rotation_mode='anchor')
  else:
    pairs = report['most_confused']
    figure, axes = plt.subplots(figsize=(8, 1.0 + 0.3 * len(pairs)))
    axes.barh([f'{p["true"]} -> {p["predicted"]}' for p in pairs][::-1],
              [p['count'] for p in pairs][::-1])
    axes.set(xlabel='examples', ylabel='true -> predicted')
    title += f' (the {len(pairs)} most-confused pairs)'
  axes.set_title(title, fontsize=10)
  figure.tight_layout()
  temporary = f'{path}.tmp.png'
  figure.savefig(temporary, dpi=100)
  plt.close(figure)
  os.replace(temporary, path)


def summary_lines(report):
  """What launch.evaluate prints."""
  lines = [f'Evaluated step {report["step"]} on {report["dataset"]} '
           f'{report["split"]} ({report["examples"]} examples): accuracy '
           f'{report["accuracy"]:.4f}'
           + (f', top-5 {report["top5_accuracy"]:.4f}'
              if report['top5_accuracy'] is not None else '')
           + f', loss {report["loss"]:.4f}'
           + (f' (moving average; raw weights {report["accuracy_raw"]:.4f})'
              if report.get('accuracy_raw') is not None else '')]
  names = report['class_names']
  if len(names) <= _MATRIX_CLASSES:
    # Columns by number, so long names never run together; rows by name.
    width = max(len(n) for n in names) + len(str(len(names))) + 3
    column = max(len(str(len(names))), *(len(str(count)) for row in
                 report['confusion_matrix'] for count in row)) + 2
    lines.append('confusion matrix (rows: true, columns: predicted, by the '
                 'rows\' numbers):')
    lines.append(' ' * width + ''.join(f'{i:>{column}}'
                                       for i in range(len(names))))
    for i, (name, row) in enumerate(zip(names, report['confusion_matrix'])):
      lines.append(f'{f"{i} {name}":>{width - 1}} '
                   + ''.join(f'{c:>{column}}' for c in row))
  else:
    lines.append('most confused: ' + ', '.join(
        f'{p["true"]}->{p["predicted"]} ({p["count"]})'
        for p in report['most_confused'][:10]))
  return lines
