"""Progressive learning (pipeline/recipe/progressive.py): the stages, their
checks, and real runs on both backends stopped by SIGTERM in their second
stage and resumed there, at its size."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import REPO, jax_args, run_train, signal_once_it_prints
from conftest import tiny_args
from configs import default
from configs import imagenet
from pipeline.errors import UserError
from pipeline.recipe import models
from pipeline.recipe import progressive


def _config(base=default, **overrides):
  config = base.get_config()
  config.update(overrides)
  return config


def _count(config):
  family = models.MODELS[config.model]
  return progressive.stage_count(config.progressive_stages,
                                 family.progressive_stages(config.model))


def _progression(config):
  """The Progression the plan resolves for `config` at its image_size."""
  family = models.MODELS[config.model]
  return progressive.Progression.of(
      config, _count(config), config.image_size,
      family.progressive_first(config.model),
      family.image_sizes(config.model)[0])


def _sizes(stages):
  return [stage.image_size for stage in stages]


def test_the_default_at_64_px_trains_at_32_then_64_on_epoch_boundaries():
  config = _config(image_size=64, progressive_stages=2, epochs=3)
  progression = _progression(config)
  progressive.check(progression)
  first, last = progressive.stages(progression, steps_per_epoch=22)
  assert (first.first_step, first.end_step, first.image_size) == (0, 22, 32)
  assert (last.first_step, last.end_step, last.image_size) == (22, 66, 64)
  # From a third of the run's magnitude and half its dropout to its own.
  assert (first.randaugment_magnitude, first.dropout_rate) == (5.0, 0.1)
  assert (last.randaugment_magnitude, last.dropout_rate) == (15.0, 0.2)
  assert progressive.stage_at((first, last), 21) is first
  assert progressive.stage_at((first, last), 22) is last
  assert progressive.stage_at((first, last), 66) is last


def test_efficientnetv2_s_takes_the_papers_four_stages_from_128_px():
  config = _config(imagenet, model='efficientnetv2_s', image_size=300,
                   randaugment_magnitude=15.0, dropout_rate=0.3)
  assert _count(config) == 4
  progression = _progression(config)
  progressive.check(progression)
  stages = progressive.stages(progression, steps_per_epoch=10)
  assert _sizes(stages) == [128, 192, 240, 300]
  assert [round(s.randaugment_magnitude, 2) for s in stages] == [
      5.0, 8.33, 11.67, 15.0]
  assert [round(s.dropout_rate, 3) for s in stages] == [0.1, 0.167, 0.233,
                                                         0.3]
  assert [s.first_step for s in stages] == [0, 870, 1750, 2620]
  assert stages[-1].end_step == 3500
  # B0 trains as its recipe does: in one stage.
  b0 = _config(imagenet, model='efficientnet_b0')
  assert _count(b0) == 0


@pytest.mark.parametrize('overrides, message', [
    (dict(progressive_stages=30, epochs=20), 'progressive_stages=30: expected '
     "0 (off), -1 (the network's recipe) or 2 to the run's 20 epochs"),
    (dict(progressive_stages=1), 'progressive_stages=1: expected 0 (off)'),
    (dict(progressive_stages=2, image_size=32), "progressive learning's first "
     'size 32 px must be at least 32 px and below the training size, 32 px'),
    (dict(progressive_stages=2, progressive_first_image_size=16),
     "first size 16 px must be at least 32 px"),
    (dict(progressive_stages=6, image_size=64), 'progressive learning from 32 '
     'to 64 px in 6 stages repeats a size (32, 32, 48, 48, 64, 64'),
])
def test_stages_that_cannot_run_are_one_line(overrides, message):
  config = _config(**dict(dict(image_size=64), **overrides))
  with pytest.raises(UserError, match=re.escape(message)):
    progressive.check(_progression(config))


def test_the_recipes_stages_give_way_where_the_data_leave_no_room(tfds_dir,
                                                                  tmp_path):
  """V2-S on the 8 px digits: the data choose 32 px, below which there is
  no first stage; its recipe's stages are off, in one line."""
  result = run_train('--config=configs/imagenet.py',
                     '--config.model=efficientnetv2_s',
                     '--config.dataset=sklearn_digits',
                     f'--config.data_dir={tfds_dir}',
                     '--config.global_batch_size=64', f'--workdir={tmp_path}',
                     '--dry_run', timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert ('Progressive learning: off (efficientnetv2_s\'s recipe trains in 4 '
          'stages growing to its size; 32 px leaves no smaller first stage, '
          'so it trains in one)') in result.stderr, result.stderr[-2000:]
  assert '32 px training (the data: 8x8 images' in result.stderr


# Eight epochs of 8 steps in two stages: the second, at 64 px, has eight
# executions after its compile for the signal to land in.
_STAGED = ('--config.image_size=64', '--config.progressive_stages=2',
           '--config.epochs=8', '--config.checkpoint_every_steps=1000')
_SECOND = 'Compiled the training step for 64 px'


def _stopped_in_the_second_stage_and_resumed(args):
  """Runs `args`, SIGTERM once the second stage's size compiled; then the
  same command again. Returns (first run's output, second's, metrics)."""
  run = subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                         cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, process_group=0)
  head = signal_once_it_prints(run, _SECOND, signal.SIGTERM, group=True)
  first = head + run.communicate(timeout=600)[1]
  assert run.returncode == 143, first[-3000:]
  second = run_train(*args, timeout=900)
  assert second.returncode == 0, second.stderr[-3000:]
  workdir = next(a.split('=', 1)[1] for a in args if a.startswith('--workdir'))
  with open(os.path.join(workdir, 'metrics.json')) as f:
    return first, second.stderr, json.load(f)


def _check_resumed_in_the_second_stage(first, second, metrics):
  # Each size compiled once: 32 px, then 64 px a second program.
  assert 'Compiled the training step for 32 px: 1 program(s)' in first
  assert 'Compiled the training step for 64 px: 2 program(s)' in first
  stopped = int(re.search(r'checkpoint of step (\d+) committed', first)
                .group(1))
  assert 32 < stopped < 64, first[-3000:]
  assert f'Resuming at step {stopped} of 64' in second
  assert re.search(r'Progressive learning, stage 2/2: steps 32-64, 64 px, '
                   rf'.* \(resumed at step {stopped}\)', second), second[-3000:]
  assert 'stage 1/2' not in second.split('Resuming at step')[1]
  # The resumed run compiled its stage's size alone.
  assert metrics['train_programs_compiled'] == 1
  assert metrics['total_steps'] == 64 and metrics['initial_step'] == stopped


# In the JAX environment (CI's JAX tier) the JAX backend's run, in
# TensorFlow's (the slow tier) TensorFlow's.
ON_JAX = os.environ.get('KERAS_BACKEND') == 'jax'


@pytest.mark.slow  # Three compiles and two runs: CI's slow tiers.
def test_a_run_stopped_in_its_second_stage_resumes_there(tfds_dir, tmp_path):
  workdir = tmp_path / 'run'
  args = (jax_args(workdir, tfds_dir, '--config.examples_per_epoch=0',
                   '--config.train_split=train[:256]', *_STAGED) if ON_JAX
          else tiny_args(workdir, tfds_dir, *_STAGED))
  _check_resumed_in_the_second_stage(
      *_stopped_in_the_second_stage_and_resumed(args))


@pytest.mark.slow  # Two whole runs: CI's slow tier.
def test_time_to_accuracy_trains_both_and_ends_in_its_line(tfds_dir, tmp_path):
  from conftest import run_module  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'runs'
  output = root / 'comparison.json'
  command = ('launch.compare', '--time_to_accuracy',
             *tiny_args(root, tfds_dir, '--config.image_size=64',
                        '--config.epochs=4'))
  result = run_module(*command, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  last = result.stdout.strip().splitlines()[-2]  # Then 'written to ...'.
  assert re.fullmatch(
      r'time to accuracy: (progressive/fixed = \d+\.\d\d \(fixed reached '
      r'(0\.\d{4}) in \d+ s; progressive reached \2 in \d+ s, final '
      r'0\.\d{4}\)|progressive never reached 0\.\d{4} .*)', last), last
  figures = json.loads(output.read_text())
  runs = figures['runs']
  assert figures['target_accuracy'] == runs['fixed']['final_accuracy']
  # Evaluated each of the 4 epochs, the last being the final evaluation.
  for label in ('fixed', 'progressive'):
    assert [step for _, step, _ in runs[label]['curve']] == [8, 16, 24, 32]
    assert runs[label]['curve'][-1][2] == runs[label]['final_accuracy']
    assert os.path.exists(os.path.join(runs[label]['workdir'],
                                       'metrics.json'))
  progressive_run = json.loads(open(os.path.join(
      runs['progressive']['workdir'], 'run.json')).read())
  assert [s['image_size'] for s in
          progressive_run['resolved']['progressive_stages']] == [32, 64]
  # The runs are the --workdir's; a rerun there would time a resumed run:
  # refused in one line, the first runs untouched.
  assert [runs[label]['workdir'] for label in ('fixed', 'progressive')] == [
      str(root / 'fixed'), str(root / 'progressive')]
  kept = (root / 'fixed' / 'metrics.json').read_bytes()
  again = run_module(*command, timeout=300)
  assert again.returncode == 1
  assert again.stderr.strip().splitlines()[-1] == (
      f'error: {root}/fixed already holds a run: --time_to_accuracy times '
      'two fresh runs; give another --workdir, or remove it')
  assert (root / 'fixed' / 'metrics.json').read_bytes() == kept
