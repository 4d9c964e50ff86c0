"""configs/default.py is the one home of every default; validation.py the one
place each field is checked.

A config file that omits keys, and a run.json written before a key existed,
get those keys from the default; a key the default lacks is one line. Every
bad value is one UserError naming the field and what is accepted.
"""

import json
import os
import re

import pytest

from configs import default
from conftest import REPO
from conftest import run_module
from pipeline.reports import evaluation
from pipeline import recipe
from pipeline.data import augmentations
from pipeline.data import sources
from pipeline.rules.config import validation
from pipeline.errors import UserError
from pipeline.data.input_spec import InputSpec

DATA_TABLES = (sources.SOURCES, augmentations.AUGMENTATIONS)


def _checked(**fields):
  config = default.get_config()
  config.update(fields)
  validation.validate(config, 2, recipe.tables(), DATA_TABLES)


def test_the_default_config_passes():
  _checked()


def test_no_default_outside_configs_default():
  """No `config.get(key, default)` in the library or the launchers: a
  default there could disagree with configs/default.py (as five did)."""
  found = []
  for folder in ('pipeline', 'launch'):
    for name in sorted(os.listdir(os.path.join(REPO, folder))):
      if name.endswith('.py'):
        with open(os.path.join(REPO, folder, name)) as f:
          found += [f'{folder}/{name}: {line.strip()}' for line in f
                    if re.search(r'config\.get\(', line)]
  assert not found, found


@pytest.mark.parametrize('fields, message', [
    (dict(global_batch_size=63), 'global_batch_size=63 does not split over 2 '
     'replicas'),
    (dict(gradient_accumulation_steps=3), 'gradient_accumulation_steps=3 must '
     'be 1 or more and split'),
    (dict(steps_per_execution=-1), 'steps_per_execution=-1 must be 1 or more, '
     'or 0'),
    (dict(examples_per_epoch=-64), 'examples_per_epoch=-64 must be 0'),
    (dict(model='efficientnet_b9'), "unknown model 'efficientnet_b9'; "
     'accepted: efficientnet_b0'),
    # The spellings users bring, from timm and keras.applications.
    (dict(model='efficientnet-b0'), re.escape(
        "unknown model 'efficientnet-b0' (did you mean 'efficientnet_b0'?)")),
    (dict(model='EfficientNetB0'), re.escape(
        "unknown model 'EfficientNetB0' (did you mean 'efficientnet_b0'?)")),
    (dict(global_batch_size=0), 'global_batch_size=0 must be 1 or more'),
    (dict(image_size=16), 'image_size=16 is too small'),
    (dict(optimizer='adam'), re.escape(
        "unknown optimizer 'adam' (did you mean 'adamw'?); accepted: adamw, "
        'sgd, rmsprop')),
    (dict(lr_schedule='step'), "unknown lr_schedule 'step'; accepted: "
     'cosine, exponential, linear'),
    (dict(ema_decay=1.0), r'ema_decay=1.0 must be in \[0, 1\)'),
    (dict(drop_connect_rate=1.5), r'drop_connect_rate=1.5 must be in \[0, 1\)'),
    (dict(mixup_alpha=-0.1), 'mixup_alpha=-0.1 must be 0 or more'),
    (dict(base_learning_rate=0.0), 'base_learning_rate=0.0 must be more than 0'),
    (dict(freeze_backbone_epochs=1.0), 'freeze_backbone_epochs=1.0 needs '
     '--config.init_from'),
    (dict(augment='flip'), "unknown augment 'flip'; accepted: none"),
    (dict(data_service='localhost:5050'), 'expected grpc://HOST:PORT'),
    (dict(data_service='grpc://localhost:5050', deterministic_input=True),
     'deterministic_input=True cannot hold through data_service'),
    (dict(epochs=0), 'epochs=0 must be 1 or more'),
    (dict(keep_checkpoints=0), 'keep_checkpoints=0 must be 1 or more'),
    (dict(recovery_max_trials=-1), 'recovery_max_trials=-1 must be 0 or more'),
    (dict(eval_every_epochs=-1.0), 'eval_every_epochs=-1.0 must be 0'),
    (dict(keep_best_metric='accuracy'), "unknown keep_best_metric 'accuracy'"),
    (dict(export_tflite='int8'), "unknown export_tflite 'int8'"),
    (dict(profile_steps='5'), "profile_steps='5'; accepted: '' \\(off\\) or "
     'START,STOP'),
])
def test_a_bad_value_is_one_line_naming_it(fields, message):
  with pytest.raises(UserError, match=message):
    _checked(**fields)


def test_a_cache_that_is_no_path_is_one_line_as_the_input_reads_it():
  config = default.get_config()
  config.update(cache='cachefile', image_size=32, augment='translate')
  with pytest.raises(UserError, match=re.escape(
      "cache='cachefile' is neither 'memory', '' or none (off), nor a "
      'path: a file cache is a path prefix, e.g. ./cachefile or '
      '/tmp/cache/cachefile')):
    InputSpec.of(config)


@pytest.mark.parametrize('typed', ['none', 'off', 'None', 'OFF'])
def test_the_words_for_no_cache_turn_it_off(typed, tmp_path, monkeypatch):
  """--config.cache=none once wrote a file cache named none-train-0.* into
  the current folder, where --config.augment=none means off."""
  monkeypatch.chdir(tmp_path)
  config = default.get_config()
  config.update(cache=typed, image_size=32, augment='translate')
  validation.validate(config, 2, recipe.tables(), DATA_TABLES)
  spec = InputSpec.of(config)
  assert spec.cache == '' and config.cache == typed  # Read, not rewritten.
  from pipeline.data import cache  # pylint: disable=g-import-not-at-top
  assert cache.choose(spec, None) == (cache.Kind.NONE, "cache=''")
  assert os.listdir(tmp_path) == []


def test_a_config_that_omits_keys_gets_the_defaults():
  config = validation.complete({'epochs': 3, 'model': 'efficientnet_b1'})
  expected = default.get_config()
  expected.update(epochs=3, model='efficientnet_b1')
  assert config.to_dict() == expected.to_dict()


def test_a_key_the_default_lacks_is_one_line():
  with pytest.raises(UserError, match="unknown config key 'epoch' in my.py; "
                     'the keys are the fields of configs/default.py'):
    validation.complete({'epoch': 3}, source='my.py')


def test_a_value_of_another_type_is_one_line():
  with pytest.raises(UserError, match=r"config key 'epochs' in my.py is 'ten' "
                     r'\(str\); configs/default.py has 20 \(int\)'):
    validation.complete({'epochs': 'ten'}, source='my.py')
  assert validation.complete({'warmup_epochs': 3}).warmup_epochs == 3.0


def test_a_run_json_from_before_a_key_existed_still_reads(tmp_path):
  """What launch.evaluate and init_from read: an old run.json without
  ema_decay and recovery_max_trials (keys added later) completes with
  configs/default.py's values, and --config overrides apply on top."""
  saved = default.get_config().to_dict()
  del saved['ema_decay'], saved['recovery_max_trials']
  saved['epochs'] = 7
  (tmp_path / 'run.json').write_text(json.dumps(
      {'config': saved, 'resolved': {'policy': 'mixed_bfloat16'}}))
  config, policy, _ = evaluation.run_config(str(tmp_path), str(tmp_path / 'st'),
                                         {'eval_split': 'train[:10]'})
  assert policy == 'mixed_bfloat16'
  assert (config.epochs, config.eval_split) == (7, 'train[:10]')
  assert config.ema_decay == default.get_config().ema_decay == 0.0
  assert config.recovery_max_trials == 3


def test_a_config_file_that_omits_keys_runs_and_takes_overrides(tmp_path,
                                                               tfds_dir):
  """Through the launcher: the file sets two keys; the run takes every
  other one from the default, and an override of a key the file omits."""
  path = tmp_path / 'short.py'
  path.write_text('import ml_collections\n\ndef get_config():\n  return '
                  'ml_collections.ConfigDict({"epochs": 3, "seed": 4})\n')
  result = run_module('launch.train', f'--config={path}', '--dry_run',
                      f'--workdir={tmp_path / "run"}',
                      f'--config.data_dir={tfds_dir}',
                      '--config.global_batch_size=32')
  assert result.returncode == 0, result.stderr[-2000:]
  assert ('66 steps' not in result.stderr and
          '132 steps (3 epochs of 44)' in result.stderr), result.stderr[-2000:]


def test_a_missing_config_file_in_the_space_form_is_named(tmp_path):
  missing = str(tmp_path / 'nope.py')
  result = run_module('launch.train', '--config', missing, '--dry_run')
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert errors == [f"error: config file {missing!r} could not be loaded; "
                    'pass a Python file with get_config(), e.g. '
                    'configs/default.py'], result.stderr[-2000:]
