"""A rerun resumes only the run its workdir holds (pipeline/run/run_workdir.py).

In process, the plan resolved as a run resolves it, its run.json written
as the run writes it: the same recipe resumes, a changed one is refused
with --workdir (one line per change, the workdir untouched) or trains in
a workdir of its own with the default one, and accepted changes are
recorded. In the slow tier, the same with real runs of launch.train.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from configs import default
from pipeline import backends
from pipeline.errors import UserError
from pipeline.recipe import models
from pipeline.rules.config import request as request_lib
from pipeline.rules.machine import hardware as devices
from pipeline.run import left_open
from pipeline.run import plan as plan_lib
from pipeline.run import run_workdir
from pipeline.storage import workdirs

from conftest import REPO, run_train, tiny_args, tree_digest


def _config(tfds_dir, **fields):
  config = default.get_config()
  config.update(data_dir=tfds_dir, train_split='train[:128]',
                eval_split='test[:64]', global_batch_size=32,
                model='efficientnet_tiny')
  config.update(fields)
  return config


def _resolve(config, workdir, **request):
  hardware = devices.Hardware(tf.distribute.get_strategy(), 'CPU',
                              detail='host CPU')
  return plan_lib.resolve(config, request_lib.Request(
      workdir=workdir, policy=request.pop('policy', 'float32'), **request),
                          hardware)


def _ran(plan):
  """The run.json a run of `plan` leaves (the loop writes the same)."""
  plan.workdir.write_json('run.json', plan.run_record())
  return plan


@pytest.fixture(name='first_run')
def fixture_first_run(tmp_path, tfds_dir):
  workdir = str(tmp_path / 'run')
  return _ran(_resolve(_config(tfds_dir), workdir)), workdir


def _opened(config, workdir, policy='float32', **request):
  """open_workdir as plan.resolve calls it: what the config leaves open
  resolved first."""
  hardware = devices.Hardware(tf.distribute.get_strategy(), 'CPU',
                              detail='host CPU')
  return run_workdir.open_workdir(
      config, request_lib.Request(workdir=workdir, **request), hardware,
      backends.load('tensorflow'), policy, _resolved(config))


def _resolved(config):
  """What the plan resolves of `config` for the digits: 32 px, shifts."""
  sizes = models.image_sizes(config.model, config.image_size or 32,
                             config.eval_image_size)
  return left_open.Resolved(sizes.train, sizes.eval,
                              config.augment or 'translate',
                              max(config.progressive_stages, 0))


def test_the_same_command_resumes_and_cadence_changes_pass(first_run,
                                                          tfds_dir):
  _, workdir = first_run
  assert _opened(_config(tfds_dir), workdir).resumed
  # How often it logs, evaluates, checkpoints, what it exports, how its
  # input is fed: the same run.
  opened = _opened(_config(tfds_dir, log_every_steps=7, eval_every_epochs=1.0,
                           checkpoint_every_steps=9, keep_checkpoints=1,
                           export=False, steps_per_execution=3, cache='',
                           deterministic_input=True), workdir)
  assert opened.resumed and opened.accepted_changes == ()
  assert opened.workdir.url == workdir


def test_a_changed_recipe_is_refused_and_the_workdir_kept(first_run,
                                                          tfds_dir):
  """The issue's case: --config.base_learning_rate changed on an explicit
  --workdir is one line naming the key and both values; nothing in the
  workdir changes."""
  _, workdir = first_run
  before = tree_digest(workdir)
  with pytest.raises(UserError) as raised:
    _resolve(_config(tfds_dir, base_learning_rate=0.05), workdir)
  assert str(raised.value) == (
      f"workdir '{workdir}' holds a run with base_learning_rate=0.01, not "
      '0.05; to start a new run use another --workdir, or to train this one '
      'on under the new values (recorded in run.json) '
      '--accept_changes=base_learning_rate')
  assert tree_digest(workdir) == before


def test_each_changed_key_is_a_line_of_its_own(first_run, tfds_dir):
  _, workdir = first_run
  with pytest.raises(UserError) as raised:
    _resolve(_config(tfds_dir, epochs=30, augment='none', seed=3), workdir,
             policy='mixed_bfloat16')
  lines = str(raised.value).split('\nerror: ')
  assert [re.match(r"workdir '.*' holds a run with (\w+)=", line).group(1)
          for line in lines] == ['augment', 'epochs', 'seed', 'policy']
  assert lines[1].endswith('epochs=20, not 30 (raising it extends that run)')
  assert lines[3].startswith(f"workdir '{workdir}' holds a run with "
                             "policy='float32', not 'mixed_bfloat16'")
  assert lines[-1].endswith('--accept_changes=augment,epochs,seed,policy')
  # Accepting some leaves the others refused.
  with pytest.raises(UserError) as raised:
    _resolve(_config(tfds_dir, epochs=30, seed=3), workdir,
             accept_changes=('epochs',))
  assert str(raised.value).endswith('--accept_changes=seed')
  assert '\n' not in str(raised.value)


def test_accepted_changes_are_recorded_in_run_json(first_run, tfds_dir):
  """Raising epochs extends the run; each accepted change is kept, the
  earlier ones first, in run.json."""
  _, workdir = first_run
  extended = _ran(_resolve(_config(tfds_dir, epochs=30), workdir,
                           accept_changes=('epochs',)))
  assert extended.total_steps == 30 * extended.steps_per_epoch
  saved = workdirs.Workdir(workdir, '').read_json('run.json')
  assert [(c['key'], c['from'], c['to']) for c in
          saved['accepted_changes']] == [('epochs', 20, 30)]
  assert saved['config']['epochs'] == 30
  # The extended run is now what the workdir holds: the same command
  # resumes it; a second accepted change is added after the first.
  assert _opened(_config(tfds_dir, epochs=30), workdir).accepted_changes == (
      saved['accepted_changes'][0],)
  _ran(_resolve(_config(tfds_dir, epochs=30, base_learning_rate=0.02),
                workdir, accept_changes=('base_learning_rate',)))
  saved = workdirs.Workdir(workdir, '').read_json('run.json')
  assert [(c['key'], c['from'], c['to']) for c in
          saved['accepted_changes']] == [('epochs', 20, 30),
                                         ('base_learning_rate', 0.01, 0.02)]


def test_the_default_workdir_gives_a_changed_recipe_its_own(first_run,
                                                            tfds_dir):
  """With the default workdir a changed recipe trains beside it, in a
  workdir named by its recipe (the same one on every rerun)."""
  _, workdir = first_run
  before = tree_digest(workdir)
  changed = _config(tfds_dir, base_learning_rate=0.05)
  opened = _opened(changed, workdir, default_workdir=True)
  digest = run_workdir.recipe_digest(run_workdir.recipe(
      changed, 'float32', _resolved(changed)))
  own = f'{workdir}-r{digest}'
  assert opened.workdir.url == own and not opened.resumed
  _ran(_resolve(changed, workdir, default_workdir=True))
  assert tree_digest(workdir) == before
  assert _opened(changed, workdir, default_workdir=True).resumed
  assert _opened(changed, workdir,
                 default_workdir=True).workdir.url == own
  # The first recipe still resumes in the default one; --accept_changes
  # there trains the first run on instead.
  assert _opened(_config(tfds_dir), workdir,
                 default_workdir=True).workdir.url == workdir
  assert _opened(changed, workdir, default_workdir=True,
                 accept_changes=('base_learning_rate',)).workdir.url == (
                     workdir)


@pytest.mark.parametrize('accept, says', [
    ('no_such_key', "--accept_changes names 'no_such_key', no setting; "
     'accepted: the keys of configs/default.py, or policy'),
    ('model', '--accept_changes=model: a run cannot change its model (its '
     'checkpoints would not restore); use another --workdir'),
])
def test_a_bad_accepted_key_is_one_line(first_run, tfds_dir, accept, says):
  _, workdir = first_run
  with pytest.raises(UserError) as raised:
    _resolve(_config(tfds_dir), workdir, accept_changes=(accept,))
  assert str(raised.value) == says


def test_a_run_json_from_before_a_key_existed_compares_with_its_default(
    tmp_path, tfds_dir):
  """An older run.json lacks keys added since: it ran with their default."""
  workdir = str(tmp_path)
  config = _config(tfds_dir)
  saved = {key: value for key, value in config.to_dict().items()
           if key != 'label_smoothing'}
  # As runs wrote it then: the sizes and augmentation in the config.
  saved.update(image_size=32, augment='translate')
  workdirs.write_json(os.path.join(workdir, 'run.json'),
                      {'config': saved, 'resolved': {'policy': 'float32'}})
  assert _opened(config, workdir).resumed
  with pytest.raises(UserError, match=r'label_smoothing=0\.1, not 0\.2'):
    _opened(_config(tfds_dir, label_smoothing=0.2), workdir)


def _launch(cwd, *args):
  """launch.train from `cwd` (where the default workdir, runs/, is)."""
  return subprocess.run(
      [sys.executable, '-m', 'launch.train', *args], cwd=cwd,
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      timeout=600, check=False)


def _refused(*args):
  """The error lines of a launch.train refused in one line (exit 1, no
  traceback)."""
  refused = run_train(*args, timeout=300)
  assert refused.returncode == 1 and 'Traceback' not in refused.stderr, (
      refused.stderr[-2000:])
  return [l for l in refused.stderr.splitlines() if l.startswith('error:')]


@pytest.mark.slow
def test_reruns_of_real_runs(tmp_path, tfds_dir):
  """The issue's sequence with real processes: a tiny run in the default
  workdir; a changed learning rate on that workdir named explicitly is
  refused in one line, the workdir untouched; with the default workdir it
  trains in its own, the first run's files untouched; the same command
  resumes (trains nothing more); raised epochs with --accept_changes
  extend the first run and run.json records it."""
  args = [arg for arg in tiny_args('unused', tfds_dir)
          if not arg.startswith('--workdir')]
  first = _launch(tmp_path, *args)
  assert first.returncode == 0, first.stderr[-3000:]
  workdir = tmp_path / 'runs' / 'efficientnet_tiny_sklearn_digits'
  before = tree_digest(str(workdir))

  errors = _refused(*args, f'--workdir={workdir}',
                    '--config.base_learning_rate=0.05')
  assert errors == [
      f"error: workdir '{workdir}' holds a run with base_learning_rate=0.01, "
      'not 0.05; to start a new run use another --workdir, or to train this '
      'one on under the new values (recorded in run.json) '
      '--accept_changes=base_learning_rate']
  assert tree_digest(str(workdir)) == before

  own = _launch(tmp_path, *args, '--config.base_learning_rate=0.05')
  assert own.returncode == 0, own.stderr[-3000:]
  found = re.search(r'Workdir: (\S+) holds another recipe \(base_learning_'
                    r'rate=0\.01, not 0\.05\); this one trains in (\S+) ',
                    own.stderr)
  assert found and found.group(1) == 'runs/efficientnet_tiny_sklearn_digits'
  with open(tmp_path / found.group(2) / 'metrics.json') as f:
    assert json.load(f)['initial_step'] == 0
  assert tree_digest(str(workdir)) == before

  again = _launch(tmp_path, *args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'Resuming at step 16 of 16' in again.stderr
  with open(workdir / 'metrics.json') as f:
    assert json.load(f)['train_steps'] == 0

  # A finished run has nothing left to train under a new learning rate:
  # refused in one line, run.json untouched (it would claim weights the
  # new rate never trained).
  before = tree_digest(str(workdir))
  errors = _refused(*args, f'--workdir={workdir}',
                    '--config.base_learning_rate=0.05',
                    '--accept_changes=base_learning_rate')
  assert errors == [
      f"error: workdir '{workdir}' holds a finished run: nothing is left to "
      'train under base_learning_rate=0.05; use another --workdir for a new '
      'run, or raise --config.epochs (with --accept_changes=epochs) to train '
      'this one longer']
  assert tree_digest(str(workdir)) == before

  extended = _launch(tmp_path, *args, '--config.epochs=3',
                     '--accept_changes=epochs')
  assert extended.returncode == 0, extended.stderr[-3000:]
  assert (f'Accepted: epochs 2 -> 3 extends the finished run in runs/'
          'efficientnet_tiny_sklearn_digits from its last checkpoint, on the '
          'schedule of a 3-epoch run from there (a cosine or linear rate '
          "rises again to that run's at this step, then decays to 0 at its "
          'end)') in extended.stderr
  assert 'Resuming at step 16 of 24' in extended.stderr
  with open(workdir / 'run.json') as f:
    run = json.load(f)
  assert [(c['key'], c['from'], c['to']) for c in
          run['accepted_changes']] == [('epochs', 2, 3)]
  with open(workdir / 'metrics.json') as f:
    assert json.load(f)['train_steps'] == 8


@pytest.mark.slow  # Two real runs: CI's slow tier.
def test_a_run_that_stops_before_its_first_step_leaves_no_recipe(tmp_path,
                                                                 tfds_dir):
  """init_from=imagenet without the network fails in one line before any
  step, leaving no run.json: the corrected command in the same workdir
  trains (it is not refused as a changed recipe)."""
  workdir = tmp_path / 'run'
  args = [arg.replace('efficientnet_tiny', 'efficientnet_b0')
          for arg in tiny_args(workdir, tfds_dir, '--config.epochs=1')]
  offline = subprocess.run(
      ['unshare', '--net', sys.executable, '-m', 'launch.train', *args,
       '--config.init_from=imagenet'], cwd=REPO, capture_output=True,
      text=True, timeout=600, check=False)
  assert offline.returncode == 1 and 'Traceback' not in offline.stderr
  assert offline.stderr.strip().splitlines()[-1].startswith(
      "error: init_from=imagenet: downloading efficientnet_b0's ImageNet "
      'weights failed'), offline.stderr[-2000:]
  assert not (workdir / 'run.json').exists()
  corrected = run_train(*args, timeout=600)
  assert corrected.returncode == 0, corrected.stderr[-3000:]
  with open(workdir / 'run.json') as f:
    assert json.load(f)['config']['init_from'] == ''
