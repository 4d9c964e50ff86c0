"""A model that has learned nothing says so: an evaluation that predicts one
class for nearly every example or scores within chance's noise is one
warning line (log, Done line, metrics.json), and launch.predict warns where
the probabilities do not vary across images; a model that learned does
not warn."""

import json
import os

import numpy as np

from conftest import run_train, tiny_args
from pipeline.reports import learning

NAMES = ('cat', 'dog', 'fox', 'owl')


def _confusion(rows):
  return np.asarray(rows, np.float64)


def test_one_class_for_every_example_is_named_with_what_to_try():
  confusion = _confusion([[0, 0, 0, 5], [0, 0, 0, 5], [0, 0, 0, 5],
                          [0, 0, 0, 4]])
  assert learning.not_learned(confusion, NAMES, 6, 141, 2) == (
      "the model has not learned yet: evaluation predicted 'owl' for 19 of 19 "
      "examples; accuracy 0.2105 is within chance's noise (0.26 +/- 0.20 "
      'over 19 examples), after 6 steps over 141 training examples (2 steps '
      'an epoch); try more steps (--config.epochs, or a smaller '
      '--config.global_batch_size), a pretrained start '
      '(--config.init_from=imagenet), or another --config.base_learning_rate')


def test_chances_accuracy_alone_warns_and_a_learned_model_does_not():
  # Spread over the classes, but no better than always saying the commonest.
  spread = _confusion([[8, 8, 8, 8], [8, 8, 8, 8], [8, 8, 8, 8],
                       [8, 8, 8, 8]])
  assert 'predicted' not in learning.not_learned(spread, NAMES, 100, 800, 10)
  assert "within chance's noise (0.25 +/- 0.08" in learning.not_learned(
      spread, NAMES, 100, 800, 10)
  learned = _confusion(np.eye(4) * 30 + 1)
  assert learning.not_learned(learned, NAMES, 100, 800, 10) == ''
  # A set of one class is answered rightly by one class: nothing to say.
  assert learning.not_learned(_confusion([[0, 0], [0, 40]]), (), 9, 90, 1) == ''


def test_probabilities_that_do_not_depend_on_the_image_are_named():
  same = np.tile([[0.392, 0.378, 0.129, 0.101]], (3, 1))
  same[1, 0] += 2e-6
  assert learning.flat_probabilities(same, ['a.jpg', 'b.jpg', 'c.jpg']) == (
      "the 3 images got the same probabilities (to 2e-06): the model's "
      'output does not depend on the image, so it has not learned; train it '
      'longer, or from a pretrained start (--config.init_from=imagenet)')
  varied = np.array([[0.9, 0.1], [0.2, 0.8]])
  assert learning.flat_probabilities(varied, ['a.jpg', 'b.jpg']) == ''
  assert learning.flat_probabilities(same[:1], ['a.jpg']) == ''


def test_a_run_of_one_step_says_it_has_not_learned(tmp_path, tfds_dir):
  workdir = tmp_path / 'run'
  result = run_train(*tiny_args(workdir, tfds_dir, '--config.epochs=1',
                                '--config.examples_per_epoch=32',
                                '--config.global_batch_size=32'))
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, 'metrics.json')) as f:
    warning = json.load(f)['learning_warning']
  assert warning.startswith('the model has not learned yet: ') and (
      'after 1 step over 256 training examples (1 step an epoch)' in
      warning), warning
  lines = result.stderr.splitlines()
  assert any(line.endswith(f'WARNING: {warning}') for line in lines)
  done = [line for line in lines if ' Done: ' in line]
  assert done and done[0].endswith(
      '; warning: the model has not learned yet (the line above)')
