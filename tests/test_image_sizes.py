"""Each network at its own resolution (models.image_sizes), evaluation at
its own size (eval_image_size), and where the sizes came from.

Runs on TensorFlow here and on JAX in the JAX tier (the run evaluated at
another size than it trains at).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, jax_args, make_tree, run_train, tiny_args
from configs import imagenet
from pipeline.recipe import models

ON_JAX = os.environ.get('KERAS_BACKEND') == 'jax'
TPU = "tensorflow/tpu's EfficientNet recipe"
AUTOML = "google/automl's EfficientNetV2 recipe"


@pytest.mark.parametrize('model, image_size, eval_image_size, says', [
    # 0: the network's own, as its published recipe trains and evaluates.
    ('efficientnet_b4', 0, 0, '380 px training, 380 px evaluation '
     f"(efficientnet_b4's own: {TPU})"),
    ('efficientnetv2_s', 0, 0, '300 px training, 384 px evaluation '
     f"(efficientnetv2_s's own: {AUTOML})"),
    ('efficientnetv2_m', 0, 0, '384 px training, 480 px evaluation '
     f"(efficientnetv2_m's own: {AUTOML})"),
    ('resnet50', 0, 0, '224 px training, 224 px evaluation '
     "(resnet50's own: the ResNet paper's ImageNet recipe)"),
    # A given training size is evaluated at unless eval_image_size says.
    ('efficientnetv2_s', 32, 0, '32 px training (image_size), 32 px '
     'evaluation (the training size)'),
    ('efficientnet_b0', 160, 224, '160 px training (image_size), 224 px '
     'evaluation (eval_image_size)'),
    ('efficientnetv2_s', 0, 416, '300 px training (efficientnetv2_s\'s '
     f'own: {AUTOML}), 416 px evaluation (eval_image_size)'),
])
def test_each_network_trains_and_evaluates_at_its_own_sizes(
    model, image_size, eval_image_size, says):
  assert models.image_sizes(model, image_size,
                            eval_image_size).describe() == says


def test_the_imagenet_config_leaves_the_size_to_the_network():
  config = imagenet.get_config()
  assert (config.image_size, config.eval_image_size) == (0, 0)
  sizes = models.image_sizes(config.model, config.image_size,
                             config.eval_image_size)
  assert (sizes.train, sizes.eval) == (224, 224)


# Counts Python's own network calls in a child (tensorflow-datasets' and
# google-cloud-storage's go through it); TensorFlow's C++ file systems find
# no network at all under `unshare --net`.
_NETWORK_AUDIT = """
import socket, sys
def _audit(event, args):
  if event in ('socket.connect', 'socket.getaddrinfo'):
    with open(%r, 'a') as f:
      f.write(event + ' ' + repr(args)[:200] + '\\n')
sys.addaudithook(_audit)
"""


def _tree(root):
  """Every folder and file under `root`, with each file's size."""
  return sorted((os.path.relpath(os.path.join(folder, name), root),
                 os.path.getsize(os.path.join(folder, name)))
                for folder, folders, files in os.walk(root)
                for name in folders + files)


def _dry_run_offline(tmp_path, *args):
  """launch.train --dry_run ARGS with no network (its own network
  namespace, Python's connections counted), from an empty folder with an
  empty tensorflow-datasets folder: (result, network calls, whether any
  file or folder appeared)."""
  audit = tmp_path / 'audit'
  audit.mkdir(exist_ok=True)
  calls = tmp_path / 'network-calls.txt'
  (audit / 'sitecustomize.py').write_text(_NETWORK_AUDIT % str(calls))
  work, data = tmp_path / 'cwd', tmp_path / 'tfds'
  work.mkdir(exist_ok=True)
  data.mkdir(exist_ok=True)
  before = _tree(tmp_path)
  env = dict(os.environ, PYTHONPATH=f'{audit}:{REPO}', HOME=str(tmp_path))
  result = subprocess.run(
      ['unshare', '--net', sys.executable, '-m', 'launch.train', '--dry_run',
       *args, f'--config.data_dir={data}'], cwd=work, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  made = sorted(set(_tree(tmp_path)) - set(before) -
                {(os.path.relpath(calls, tmp_path), os.path.getsize(calls))
                 if calls.exists() else None})
  return result, calls.read_text() if calls.exists() else '', made


@pytest.mark.parametrize('model, says', [
    ('efficientnet_b0', '224 px training, 224 px evaluation '
     f"(efficientnet_b0's own: {TPU})"),
    ('efficientnet_b4', '380 px training, 380 px evaluation '
     f"(efficientnet_b4's own: {TPU})"),
    ('efficientnetv2_s', '300 px training, 384 px evaluation '
     f"(efficientnetv2_s's own: {AUTOML})"),
])
def test_the_imagenet_config_plans_without_imagenet_or_the_network(
    tmp_path, model, says):
  """ImageNet is not here and cannot be fetched: the dry run plans from
  tensorflow-datasets' registered builder, downloads nothing, and creates
  no file or folder (no workdir, no data folder)."""
  (tmp_path / '.keras').mkdir()  # Keras' own settings file, on import.
  (tmp_path / '.keras' / 'keras.json').write_text('{}')
  result, calls, made = _dry_run_offline(
      tmp_path, f'--config={REPO}/configs/imagenet.py',
      f'--config.model={model}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'dry run: everything checks out' in result.stdout
  assert (f'Data: imagenet2012, 1000 classes, its sizes known once '
          f'tensorflow-datasets has prepared it (the run prepares it first); '
          f'{says}; 350 epochs;') in result.stderr, result.stderr[-3000:]
  if model == 'efficientnetv2_s':  # The network's four stages, up to 300.
    for size in (128, 192, 240, 300):
      assert f', {size} px, mixup 0, dropout' in result.stderr
  assert calls == '' and made == [], (calls, made)


def test_a_dry_run_of_a_downloadable_set_makes_no_network_call(tmp_path):
  (tmp_path / '.keras').mkdir()
  (tmp_path / '.keras' / 'keras.json').write_text('{}')
  result, calls, made = _dry_run_offline(tmp_path, '--config.dataset=cifar10')
  assert result.returncode == 0, result.stderr[-3000:]
  # Its registered image shape decides the size: 32x32 images train at 32.
  assert ('Data: cifar10, 10 classes, its sizes known once tensorflow-datasets '
          'has prepared it') in result.stderr
  assert "32 px training (the data: 32x32 images (cifar10's metadata)" in (
      result.stderr)
  assert calls == '' and made == [], (calls, made)


def test_the_tables_are_the_published_recipes(monkeypatch):
  """Each network of keras.applications is built at its evaluation size
  (its published weights' size: `default_size`, which Keras' constructor
  hands its builder, read here without building the network), which is
  tensorflow/tpu's for B0-B7 (trained at the same size) and google/automl's
  for V2."""
  import keras  # pylint: disable=g-import-not-at-top
  from keras.src.applications import efficientnet as keras_v1  # pylint: disable=g-import-not-at-top  # The builder the constructors call.
  from keras.src.applications import efficientnet_v2 as keras_v2  # pylint: disable=g-import-not-at-top
  from pipeline.recipe.models import efficientnet  # pylint: disable=g-import-not-at-top
  built = []
  for module, builder in ((keras_v1, 'EfficientNet'),
                          (keras_v2, 'EfficientNetV2')):
    monkeypatch.setattr(module, builder, lambda *args, **kwargs: built.append(
        kwargs.get('default_size', args[2] if len(args) > 2 else None)))
  constructor = lambda name: getattr(
      keras.applications, f'EfficientNetB{name[-1]}' if name in
      efficientnet.V1 else f'EfficientNetV2{name.split("_")[1].upper()}')
  for name in (*efficientnet.V1, *efficientnet.V2):
    train, evaluation, _ = models.MODELS[name].image_sizes(name)
    constructor(name)(weights=None)
    assert built.pop() == evaluation, name
    if name in efficientnet.V1:
      assert train == evaluation, name
    else:
      assert train < evaluation, name
  assert models.MODELS['resnet50'].image_sizes('resnet50')[:2] == (224, 224)


@pytest.mark.slow
def test_a_run_evaluates_and_exports_at_its_evaluation_size(tfds_dir,
                                                            tmp_path):
  """Trained at 32 px and evaluated at 48 (the network takes any size) on
  64 px images (the digits enlarged: the 8 px ones refuse a larger
  evaluation): its evaluation's inputs are 48 px, the export serves 48 px
  images and its metadata says both sizes; run.json says where they came
  from."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  make_tree(tmp_path / "tree", per_class=40, scale=8)
  extra = ('--config.image_size=32', '--config.eval_image_size=48',
           '--config.export=true',
           '--config.dataset=image_folder',
           f'--config.train_dir={tmp_path / "tree"}')
  args = (jax_args(workdir, tfds_dir, *extra) if ON_JAX else
          tiny_args(workdir, tfds_dir, *extra))
  result = run_train(*args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ('32 px training (image_size), 48 px evaluation (eval_image_size)'
          in result.stderr)
  run = json.loads((workdir / 'run.json').read_text())
  assert (run['resolved']['image_size'],
          run['resolved']['eval_image_size']) == (32, 48)
  metadata = json.loads((workdir / 'export' / 'metadata.json').read_text())
  assert metadata['preprocessing']['image_size'] == 48
  assert metadata['train_image_size'] == 32
  export = tf.saved_model.load(str(workdir / 'export'))
  spec = export.serve.get_concrete_function().inputs[0].shape
  assert spec.as_list() == [None, 48, 48, 3]
  images = np.random.RandomState(0).randint(0, 256, (2, 48, 48, 3))
  assert export.serve(images.astype(np.uint8)).shape == (2, 10)
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['image_size'] == 32 and metrics['eval_image_size'] == 48
