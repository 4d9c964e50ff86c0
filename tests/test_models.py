"""The model families as registered parts: their names, their published
weights loaded as Keras builds them (Keras' download stood in by a local
file, its name checked), ResNet-50 trained, exported and read back by
launch.predict; and docs/configs-and-data.md's tables of every kind of named part
against the tables themselves."""

import json
import os
import re

import keras
import numpy as np
import pytest

from configs import default
from conftest import REPO
from conftest import run_module
from conftest import run_train
from pipeline import recipe
from pipeline.data import augmentations
from pipeline.data import sources
from pipeline.errors import UserError
from pipeline.recipe import finetune
from pipeline.recipe import models

SIZE = 32


def _publish(name, folder, monkeypatch):
  """Keras' published headless weights of `name` as a local file, and
  Keras' download made to hand it over; the names Keras asked for."""
  family = models.MODELS[name]
  keras.utils.set_random_seed(1)
  network = family.headless(name, None, (SIZE, SIZE, 3))
  for weight in network.weights:  # Not the freshly built values.
    weight.assign(weight + 0.01 * np.random.default_rng(0).standard_normal(
        weight.shape).astype('float32'))
  normalization = [layer for layer in network.layers
                   if isinstance(layer, keras.layers.Normalization)
                   and layer.input_mean is None]
  for layer in normalization:  # As Keras' file holds them: ImageNet's.
    layer.adapt_mean.assign([0.485, 0.456, 0.406])
    layer.adapt_variance.assign([0.229**2, 0.224**2, 0.225**2])
  path = os.path.join(folder, family.published_file(name))
  # Keras' files are in Keras 2's format, its layers by name.
  import h5py  # pylint: disable=g-import-not-at-top
  from keras.src.legacy.saving import legacy_h5_format  # pylint: disable=g-import-not-at-top
  with h5py.File(path, 'w') as f:
    legacy_h5_format.save_weights_to_hdf5_group(f, network)
  asked = []

  def get_file(fname=None, origin=None, **kwargs):
    del origin, kwargs
    asked.append(fname)
    return path
  from keras.src.utils import file_utils  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(file_utils, 'get_file', get_file)
  return asked


@pytest.mark.parametrize('name', ['efficientnet_b0', 'efficientnetv2_b0',
                                  'resnet50'])
def test_published_weights_compute_what_keras_imagenet_network_does(
    name, tmp_path, monkeypatch):
  """init_from=imagenet into a run's model: its backbone then computes on
  the run's uint8 images what Keras' own ImageNet network computes on them
  (after keras.applications' preprocess_input, for ResNet-50), loaded from
  the file of the name Keras publishes."""
  asked = _publish(name, str(tmp_path), monkeypatch)
  config = default.get_config()
  config.update(model=name, image_size=SIZE, init_from='imagenet')
  model = models.build_model(name, 10, SIZE, forms=dict(
      batch_norm='one_pass', squeeze_excite='matmul', depthwise='conv'))
  said = finetune.load_init_from(finetune.FineTuning.of(config), model, (),
                                 str(tmp_path))
  assert said == "backbone from keras.applications' ImageNet weights"
  theirs = models.MODELS[name].headless(name, 'imagenet', (SIZE, SIZE, 3))
  assert asked == [models.MODELS[name].published_file(name)] * 2
  images = np.random.default_rng(2).integers(0, 256, (4, SIZE, SIZE, 3))
  pixels = images.astype('float32')
  if name == 'resnet50':
    pixels = keras.applications.resnet.preprocess_input(pixels)
  inputs = images.astype('uint8')
  for layer in model.layers[1:]:  # The run's model, up to its backbone.
    if layer is models.backbone(model):
      break
    inputs = layer(inputs)
  # The stem's activations (the deep features of random weights are all
  # near 0, where any input would agree), then the pooled features.
  stem = {'resnet50': 'conv1_relu'}.get(name, 'stem_activation')
  for ours_at, theirs_at in (
      [layer.get_layer(stem).output for layer in (models.backbone(model),
                                                  theirs)],
      [models.backbone(model).output, theirs.output]):
    ours = keras.Model(models.backbone(model).input, ours_at)(inputs)
    expected = keras.ops.convert_to_numpy(
        keras.Model(theirs.input, theirs_at)(pixels))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), expected,
                               rtol=1e-3, atol=1e-4 * np.abs(expected).max())


def test_published_file_names():
  assert finetune.published_file('efficientnet_b3') == 'efficientnetb3_notop.h5'
  assert finetune.published_file('efficientnetv2_s') == (
      'efficientnetv2-s_notop.h5')
  assert finetune.published_file('resnet50') == (
      'resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5')
  with pytest.raises(UserError, match='efficientnet_tiny has no published '
                     'ImageNet weights'):
    finetune.published_file('efficientnet_tiny')


def test_an_unknown_model_lists_every_name():
  config = default.get_config()
  config.model = 'resnet51'
  with pytest.raises(UserError, match=re.escape(
      "unknown model 'resnet51'; accepted: efficientnet_b0, ")) as raised:
    models.MODELS.check(config)
  assert str(raised.value).endswith('efficientnet_tiny, resnet50')


# The backend of this test environment: TensorFlow in the fast suite's, JAX
# in the JAX tier's.
BACKEND = keras.backend.backend()


@pytest.mark.slow  # Half a minute: a compile and a few executions.
@pytest.mark.skipif(BACKEND != 'tensorflow', reason='once, on TensorFlow: '
                    'the backend is not what this test is about')
def test_resnet50_is_benchmarked_by_name(tmp_path):
  output = tmp_path / 'benchmark.json'
  result = run_module('launch.benchmark', '--config.model=resnet50',
                      '--config.global_batch_size=16',
                      '--config.steps_per_execution=2', '--num_executions=1',
                      f'--output={output}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'resnet50 at 32 px, batch 16' in result.stdout, result.stdout
  figures = json.loads(output.read_text())
  assert figures['model'] == 'resnet50'
  assert figures['train_real_images_per_sec'] > 0, figures


# Keras' download, stood in from outside the project in the run's own
# process (a sitecustomize, as Keras' module loads): the file of the name
# asked for, from a folder; no network here.
_DOWNLOAD_STAND_IN = """import importlib.abc, importlib.machinery, os, sys

class Hook(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name != 'keras.src.utils.file_utils':
      return None
    sys.meta_path.remove(self)
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      def get_file(fname=None, origin=None, **kwargs):
        print(f'stand-in download: {fname}', file=sys.stderr)
        return os.path.join(os.environ['PUBLISHED'], fname)
      module.get_file = get_file
    spec.loader.exec_module = exec_module
    return spec

sys.meta_path.insert(0, Hook())
"""


@pytest.mark.slow  # Minutes on JAX, one on TensorFlow: CI's slow tiers.
def test_resnet50_fine_tunes_from_published_weights_exports_and_predicts(
    tfds_dir, tmp_path, monkeypatch):
  """ResNet-50 through launch.train on this environment's backend, from
  the published file of the name Keras asks for (Keras' download stood
  in: no network here) loaded into the run's backbone (that its values
  are Keras' own network's is test_published_weights_compute_what_keras_
  imagenet_network_does), a few steps on the digits, and its export read
  by launch.predict. One run for all three: each is minutes on JAX."""
  published = tmp_path / 'published'
  published.mkdir()
  _publish('resnet50', str(published), monkeypatch)
  site = tmp_path / 'site'
  site.mkdir()
  (site / 'sitecustomize.py').write_text(_DOWNLOAD_STAND_IN)
  workdir = tmp_path / 'run'
  result = run_train(f'--workdir={workdir}', f'--backend={BACKEND}',
                     '--policy=float32', '--config.model=resnet50',
                     '--config.init_from=imagenet',
                     f'--config.data_dir={tfds_dir}',
                     '--config.train_split=train[:64]', '--config.epochs=1',
                     '--config.global_batch_size=16',
                     '--config.eval_every_epochs=0',
                     env={'PYTHONPATH': str(site), 'PUBLISHED': str(published)})
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Recipe: resnet50, no stochastic depth;' in result.stderr
  assert ('stand-in download: '
          f"{models.MODELS['resnet50'].published_file('resnet50')}") in (
              result.stderr)
  assert "backbone from keras.applications' ImageNet weights" in result.stderr
  image = tmp_path / 'seven.png'
  from PIL import Image  # pylint: disable=g-import-not-at-top
  Image.fromarray(np.full((8, 8, 3), 200, 'uint8')).save(image)
  predicted = run_module('launch.predict', f'--model={workdir}/export',
                         str(image))
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  assert re.search(rf'{image}: \d \d\.\d{{3}}', predicted.stdout), (
      predicted.stdout)


# Where the tables of every kind of named part are, for users.
CONFIGS_PAGE = os.path.join(REPO, 'docs', 'configs-and-data.md')


def _readme_table(kind):
  """The names the docs' table of `kind` lists, in order."""
  text = open(CONFIGS_PAGE, encoding='utf-8').read()
  table = text.split(f'<!-- named parts: {kind} -->')[1].split('\n\n')[0]
  return [re.findall(r'`([^`]+)`', row.split('|')[1])
          for row in table.splitlines()[3:] if row.startswith('|')]


@pytest.mark.parametrize('table', [
    sources.SOURCES, augmentations.AUGMENTATIONS, *recipe.tables()],
                         ids=lambda table: table.key)
def test_the_readme_lists_every_part_as_its_table_does(table):
  """Each table of named parts has its table in the docs, a row per
  part in the table's order, naming every name the part answers to and
  the keys it adds, with its description."""
  rows = _readme_table(table.key)
  text = open(CONFIGS_PAGE, encoding='utf-8').read()
  section = text.split(f'<!-- named parts: {table.key} -->')[1].split(
      '\n\n')[0]
  assert len(rows) == len(table.parts())
  for row, part in zip(rows, table.parts()):
    assert row == list(part.names()) or (not part.names() and row == []), (
        row, part.names())
    assert part.description in section, part.description
    for key in part.keys:
      assert f'`{key}`' in section, key
