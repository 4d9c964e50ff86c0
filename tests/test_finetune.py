"""Fine-tuning from another run, in this process, on tiny real runs.

A source run (B0's code at a fraction of its size, with mixup and a moving
average) trains a few steps. A second run starts from its workdir with the
backbone frozen for two epochs: the backbone it trains with is the source's moving average (not
its random start, nor the source's raw weights), and stays so while frozen.
The run is stopped inside the frozen phase, the source is deleted, and the
run resumes from its own checkpoint: it needs nothing of the source, stays
frozen to the boundary, then trains the whole model.

The slow case proves what fine-tuning is for: on digits 5-9, a backbone
pretrained on digits 0-4 beats the same number of steps from scratch.
"""

import contextlib
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from configs import default
from pipeline.rules.machine import hardware as devices
from pipeline.backends.tensorflow import ema as ema_lib
from pipeline.recipe import models
from pipeline.run import plan as plan_lib
from pipeline.training import loop
from pipeline.rules.config import request as request_lib


# What is tested is the weights' path, not the network: B0's code at a
# fraction of its size (fine-tuning's programs for each family are traced by
# test_recipe_matrix.py).
NETWORK = 'efficientnet_tiny'


class _Stop(Exception):
  pass


def _config(tfds_dir, **fields):
  config = default.get_config()
  # Digits, in tfds or in TFRecord files: shifts, not a photograph's
  # mirrored crops.
  config.update(data_dir=tfds_dir, train_split='train[:128]',
                eval_split='test[:64]', global_batch_size=32,
                steps_per_execution=2, log_every_steps=2, eval_every_epochs=0,
                checkpoint_every_steps=2, model=NETWORK, augment='translate')
  config.update(fields)
  return config


def _plan(config, workdir):
  hardware = devices.Hardware(tf.distribute.get_strategy(), 'CPU',
                              detail='host CPU')
  return plan_lib.resolve(config, request_lib.Request(workdir=workdir), hardware)


def _backbone(workdir, step, averaged=False):
  """The backbone's float weights in a run's checkpoint of `step` (its
  moving average if `averaged`), restored into a model of their own."""
  model = models.build_model(NETWORK, 10, 32)
  trackables = {'model': model}
  if averaged:
    average = ema_lib.MovingAverage(model, 0.9)
    trackables['ema'] = average.trackable
  tf.train.Checkpoint(**trackables).read(
      os.path.join(workdir, 'checkpoints', f'ckpt-{step}')).expect_partial()
  with average.applied_to_model() if averaged else contextlib.nullcontext():
    return [w.numpy() for w in models.backbone(model).weights
            if w.dtype == 'float32']


def _same(arrays, others):
  assert arrays and len(arrays) == len(others)
  return all(np.array_equal(a, b) for a, b in zip(arrays, others))


# Three in-process runs (about 80 s in CI): the slow tier keeps the fast
# suite in 12 min. Loading a backbone is covered fast in
# test_recipe.py; freezing, thawing and resuming only here.
@pytest.mark.slow
def test_fine_tuning_from_a_run_freezes_thaws_and_resumes(tmp_path, tfds_dir):
  source_dir, run_dir = str(tmp_path / 'source'), str(tmp_path / 'run')
  config = _config(tfds_dir, epochs=1, ema_decay=0.9, mixup_alpha=0.2)
  source = loop.train_and_evaluate(_plan(config, source_dir))
  assert source['train_steps'] == 4
  assert source['eval_accuracy_raw'] is not None
  averaged = _backbone(source_dir, 4, averaged=True)
  assert not _same(averaged, _backbone(source_dir, 4))

  executions = []

  def stop_at_step_4(execution):
    executions.append((execution.first_step, execution.step))
    if execution.first_step == 4:
      raise _Stop()

  config = _config(tfds_dir, epochs=3, init_from=source_dir,
                   freeze_backbone_epochs=2, train_split='train[128:256]',
                   keep_checkpoints=10)
  plan = _plan(config, run_dir)
  assert plan.frozen_steps == 8 and plan.total_steps == 12
  with pytest.raises(_Stop):
    loop.train_and_evaluate(plan, extra_actions=[stop_at_step_4])
  # The source's moving average arrived, and stays while frozen.
  assert _same(_backbone(run_dir, 2), averaged)
  assert _same(_backbone(run_dir, 4), averaged)

  shutil.rmtree(source_dir)  # A resume needs nothing of the source.
  executions.clear()
  resumed = loop.train_and_evaluate(_plan(config, run_dir),
                                     extra_actions=[executions.append])
  assert resumed['initial_step'] == 4
  assert [(e.first_step, e.step) for e in executions] == [
      (4, 6), (6, 8), (8, 10), (10, 12)]
  assert _same(_backbone(run_dir, 8), averaged)  # Frozen to the boundary,
  after = _backbone(run_dir, 10)
  assert not _same(after, averaged)  # then thawed,
  assert not _same(_backbone(run_dir, 12), after)  # and training.


def _digits_tfrecords(folder):
  """scikit-learn's digits as PNG TFRecords: 0-4 (labels 0-4) to pretrain
  on, and 5-9 (labels 0-4 too) split into a small training set and a
  held-out set."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfrecord import records as tfrecords  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  order = np.random.RandomState(0).permutation(len(images))
  images, labels = images[order], digits.target[order]

  def write(name, keep):
    records = [tfrecords.serialize(
        tf.io.encode_png(image[:, :, None]).numpy(), int(label % 5))
               for image, label in zip(images[keep], labels[keep])]
    path = os.path.join(folder, f'{name}.tfrecord')
    tfrecords.write(path, records)
    return path, len(records)

  low, high = np.flatnonzero(labels < 5), np.flatnonzero(labels >= 5)
  return {'source': write('source', low), 'target': write('target', high[:150]),
          'held_out': write('held_out', high[150:])}


@pytest.mark.slow
def test_fine_tuning_beats_training_from_scratch(tmp_path):
  """Digits 0-4 pretrain B0's blocks (the tiny network: what fine-tuning
  carries is tested, not B0's size); on digits 5-9 (150 training images),
  the same 25 steps from that backbone beat 25 steps from a random
  start."""
  files = _digits_tfrecords(str(tmp_path))
  common = dict(dataset='tfrecord', num_classes=5, data_dir='',
                model='efficientnet_tiny', eval_split='', train_split='',
                steps_per_execution=5, log_every_steps=5, eval_every_epochs=0,
                checkpoint_every_steps=1000, global_batch_size=30)
  source_dir = str(tmp_path / 'source')
  config = _config('', train_files=files['source'][0],
                   eval_files=files['source'][0], epochs=10, **common)
  source = loop.train_and_evaluate(_plan(config, source_dir))
  assert source['eval_accuracy'] > 0.8  # It learned digits 0-4,
  assert source['learning_warning'] is None  # and does not say otherwise.

  results = {}
  for name, init_from in (('scratch', ''), ('fine-tuned', source_dir)):
    config = _config('', train_files=files['target'][0],
                     eval_files=files['held_out'][0], epochs=5,
                     init_from=init_from, **common)
    results[name] = loop.train_and_evaluate(
        _plan(config, str(tmp_path / name)))
    assert results[name]['train_steps'] == 25
  print({name: round(r['eval_accuracy'], 4) for name, r in results.items()})
  assert (results['fine-tuned']['eval_accuracy'] >
          results['scratch']['eval_accuracy'] + 0.1)
