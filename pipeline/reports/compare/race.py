"""A race against the code a user would write: launch.compare --against=keras.

The same folder of photographs, split once into the same training and
held-out images (links to the files, as image_folder holds them out), is
trained twice, one after the other, each in a fresh process timed from
its start and evaluated after every epoch on the held-out images: by the
Keras example's code (keras_peer.py: image_dataset_from_directory,
EfficientNetB0(weights=None) at 224 px, flip and rotation layers, Adam,
model.fit), and by launch.train with this project's defaults for that
folder. The verdict is one line: each run's best accuracy and when it
first reached it, our time to the peer's best over the peer's time to it,
and each one's accuracy at the peer's wall time.
"""

import json
import os
import subprocess
import time

from absl import logging

from pipeline.errors import UserError
from pipeline.reports.compare import time_to_accuracy
from pipeline.launchers import Launcher
from pipeline import launchers

PEER = 'keras'
# Keras' examples train EfficientNetB0 at its own size.
PEER_IMAGE_SIZE = 224


def race(listed, train_args, root, epochs, peer_image_size=PEER_IMAGE_SIZE):
  """Both runs of images `listed` one by one (a folder's or a CSV's:
  ListedImages.listed's class names and splits) under `root` (ours:
  launch.train with `train_args`, its config overrides and hardware flags,
  on the same split as a folder); the result dict, with 'line'."""
  split = _split(*listed[:2], os.path.join(root, 'split'))
  runs = {}
  for label, command in (
      (PEER, launchers.command(
          Launcher.KERAS_PEER, split['train'], split['eval'], str(epochs),
          str(peer_image_size), os.path.join(root, PEER, 'curve.json'))),
      ('ours', [*launchers.command(Launcher.TRAIN), *train_args,
                '--config.dataset=image_folder',
                f'--config.train_dir={split["train"]}',
                f'--config.eval_dir={split["eval"]}',
                f'--config.epochs={epochs}', '--config.eval_every_epochs=1',
                f'--workdir={os.path.join(root, "ours")}'])):
    runs[label] = _timed(label, command, os.path.join(root, label))
  return verdict(runs)


def _split(names, files, folder):
  """The training and held-out images `files` ({'train': [(path, label)],
  'eval': ...}, the held-out share the source's own) as two folders of
  links, a folder per class (`names`, else the label), made once;
  {'train': path, 'eval': path}."""
  paths = {}
  for split, listed in files.items():
    paths[split] = os.path.join(folder, split)
    for index, (path, label) in enumerate(listed):
      link = os.path.join(paths[split], names[label] if names else str(label),
                          f'{index:06d}-{os.path.basename(path)}')
      if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.abspath(path), link)
  return paths


def _timed(label, command, workdir):
  """Runs one side in a fresh process timed from its start; its curve
  [[seconds, epoch, accuracy]] and wall time."""
  if os.path.exists(workdir) and os.listdir(workdir):
    raise UserError(f'{workdir} already holds a run: --against times fresh '
                    'runs; give another --workdir, or remove it')
  os.makedirs(workdir, exist_ok=True)
  logging.info('Race: the %s run in %s', label, workdir)
  started = time.time()
  with open(os.path.join(workdir, 'race.log'), 'w') as log:
    child = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                           check=False)
  wall_s = time.time() - started
  if child.returncode:
    raise UserError(f'the {label} run failed (exit {child.returncode}; its '
                    f'log: {os.path.join(workdir, "race.log")})')
  if label == PEER:
    with open(os.path.join(workdir, 'curve.json')) as f:
      curve = [[round(at - started, 1), epoch, accuracy]
               for at, epoch, accuracy in json.load(f)]
  else:
    curve = time_to_accuracy.eval_curve(workdir, started)
  return {'workdir': workdir, 'wall_s': round(wall_s, 1), 'curve': curve}


def _best(curve):
  """(best accuracy, the seconds it was first reached)."""
  best = max(accuracy for _, _, accuracy in curve)
  return best, time_to_accuracy.reached(curve, best)


def _at(curve, seconds):
  """The accuracy of the last evaluation at or before `seconds` (0 before
  the first)."""
  return max([(at, accuracy) for at, _, accuracy in curve if at <= seconds],
             default=(0, 0.0))[1]


def verdict(runs):
  """The result of two runs' curves: the figures and the one line."""
  peer, ours = runs[PEER], runs['ours']
  peer_best, peer_s = _best(peer['curve'])
  our_best, our_best_s = _best(ours['curve'])
  ours_to_peer = time_to_accuracy.reached(ours['curve'], peer_best)
  ratio = ours_to_peer / peer_s if ours_to_peer is not None else None
  wall = peer['wall_s']
  at_wall = {PEER: _at(peer['curve'], wall), 'ours': _at(ours['curve'], wall)}
  line = (f'race against keras: keras best {peer_best:.4f} at {peer_s:.0f} s '
          f'(its run {wall:.0f} s); ours best {our_best:.4f} at '
          f'{our_best_s:.0f} s, '
          + (f'reached keras\' best at {ours_to_peer:.0f} s ({ratio:.2f} of '
             'its time)' if ratio is not None else
             'never reached keras\' best')
          + f'; at {wall:.0f} s ours {at_wall["ours"]:.4f}, keras '
          f'{at_wall[PEER]:.4f} '
          f'({100 * (at_wall["ours"] - at_wall[PEER]):+.1f} points)')
  return {'runs': runs, 'peer_best': peer_best, 'peer_best_s': peer_s,
          'ours_best': our_best, 'ours_best_s': our_best_s,
          'ours_to_peer_best_s': ours_to_peer, 'ratio': ratio,
          'at_peer_wall': at_wall, 'line': line}
