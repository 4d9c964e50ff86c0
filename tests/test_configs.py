"""Every config file loads and names a model, data set and sane batch."""

import glob
import importlib
import os

import pytest

from conftest import REPO
from pipeline import recipe
from pipeline.data import augmentations
from pipeline.data import sources
from pipeline.recipe import models
from pipeline.rules.config import validation

CONFIGS = sorted(os.path.basename(p)[:-3] for p in
                 glob.glob(os.path.join(REPO, 'configs', '*.py'))
                 if not p.endswith('__init__.py'))

DATA_TABLES = (sources.SOURCES, augmentations.AUGMENTATIONS)


def test_the_issue_keys_exist_in_the_default():
  config = importlib.import_module('configs.default').get_config()
  for key in ('dataset', 'model', 'image_size', 'global_batch_size', 'epochs',
              'steps_per_execution'):
    assert key in config
  assert config.steps_per_execution >= 0  # 0: picked per device.


@pytest.mark.parametrize('name', CONFIGS)
def test_config_is_valid(name):
  config = importlib.import_module(f'configs.{name}').get_config()
  assert config.model in models.MODELS
  assert config.global_batch_size % 8 == 0  # Splits over 8 TPU cores or GPUs.
  assert config.image_size == 0 or config.image_size >= 32  # 0: its own.
  # Every value passes the checks a run makes before it builds anything.
  validation.validate(config, 8, recipe.tables(), DATA_TABLES)
