"""Time to accuracy: a config trained as it is and again with progressive
learning, one after the other on the same data and hardware, each in a
fresh `launch.train` process, timed from its start (building, compiling and
evaluating included), evaluated every epoch.

A is the fixed run's final evaluation accuracy; each run's time to A is the
first evaluation at A or above, read from its TensorBoard eval curve (each
event's wall time). The ratio progressive/fixed below 1 is the time the
stages save.
"""

import json
import os
import subprocess
import time

from absl import logging
import tensorflow as tf

from pipeline.errors import UserError
from pipeline.rules.config import validation
from pipeline.storage import workdirs
from pipeline.launchers import Launcher
from pipeline import launchers


LABELS = ('fixed', 'progressive')


def stage_count(progressive_stages, recipe_count):
  """The progressive run's stages: `progressive_stages` where it names 2
  or more, else the network's recipe's `recipe_count`, else 2."""
  return (progressive_stages if progressive_stages > 1 else
          max(recipe_count, 2))


def measure(train_args, stages, root):
  """Both runs of `train_args` (launch.train's flags; a --workdir among
  them is overridden) in `root`/fixed and `root`/progressive (`stages`
  stages); the result dict, with 'line', the one-line verdict."""
  _check_fresh(root)
  runs = {}
  for label, count in zip(LABELS, (0, stages)):
    workdir = os.path.join(root, label)
    logging.info('Time to accuracy: the %s run (progressive_stages=%d) in %s',
                 label, count, workdir)
    started = time.time()
    # Its progress lines go to this terminal as the run's own do.
    child = subprocess.run(
        [*launchers.command(Launcher.TRAIN), *train_args,
         f'--workdir={workdir}', f'--config.progressive_stages={count}',
         '--config.eval_every_epochs=1'], check=False)
    if child.returncode:
      raise UserError(f'the {label} run of --time_to_accuracy failed (exit '
                      f'{child.returncode}; its error is above, its log in '
                      f'{workdir})')
    with tf.io.gfile.GFile(os.path.join(workdir, workdirs.File.METRICS)) as f:
      final = json.load(f)[validation.Metric.EVAL_ACCURACY]
    runs[label] = {'workdir': workdir, 'final_accuracy': final,
                   'wall_s': time.time() - started,
                   'curve': eval_curve(workdir, started)}
  return _verdict(runs)


def _check_fresh(root):
  """Both runs are timed from their first step: a workdir that holds a run
  would be resumed (or found finished) and its times mean nothing, and
  nothing of it may be overwritten. One line, before either run starts."""
  for label in LABELS:
    workdir = os.path.join(root, label)
    if tf.io.gfile.exists(workdir) and tf.io.gfile.listdir(workdir):
      raise UserError(
          f'{workdir} already holds a run: --time_to_accuracy times two '
          'fresh runs; give another --workdir, or remove it')


def eval_curve(workdir, started):
  """[[seconds since `started`, step, accuracy]] of a run's evaluations,
  from its TensorBoard eval events, in order."""
  points = []
  for path in tf.io.gfile.glob(os.path.join(workdir, 'tensorboard', 'eval',
                                           'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == 'accuracy':
          points.append([round(event.wall_time - started, 1), event.step,
                         float(tf.make_ndarray(value.tensor))])
  return sorted(points)


def reached(curve, target):
  """The seconds of the first evaluation at `target` or above (None: none)."""
  return next((seconds for seconds, _, accuracy in curve
               if accuracy >= target), None)


def _verdict(runs):
  target = runs['fixed']['final_accuracy']
  fixed_s = reached(runs['fixed']['curve'], target)
  progressive_s = reached(runs['progressive']['curve'], target)
  final = runs['progressive']['final_accuracy']
  if progressive_s is None:
    line = (f'time to accuracy: progressive never reached {target:.4f} '
            f'(fixed reached it in {fixed_s:.0f} s; progressive final '
            f'{final:.4f})')
    ratio = None
  else:
    ratio = progressive_s / fixed_s
    line = (f'time to accuracy: progressive/fixed = {ratio:.2f} (fixed '
            f'reached {target:.4f} in {fixed_s:.0f} s; progressive reached '
            f'{target:.4f} in {progressive_s:.0f} s, final {final:.4f})')
  return {'runs': runs, 'target_accuracy': target, 'fixed_s': fixed_s,
          'progressive_s': progressive_s, 'ratio': ratio, 'line': line}
