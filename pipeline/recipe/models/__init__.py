"""The networks a config names, each family one object in one module here,
registered in MODELS by every model name it builds: efficientnet.py
(EfficientNet B0-B7, V2, and a tiny one for checks), resnet.py
(ResNet-50). A new family is a module here (a models.family.ModelFamily)
and its registration line below.

Every model takes uint8 images (the input pipeline ships a quarter of
float32's bytes; the cast happens on the device), runs its family's
headless keras.applications network, and ends in a float32 head, so
logits and loss stay float32 under every policy (keras.applications' own
top would run softmax in the compute dtype). The headless network is one
nested layer, `backbone(model)`: what published weights load into, what
fine-tuning freezes.
"""

import keras

from pipeline import parts
from pipeline.recipe import layers
from pipeline.recipe.models import efficientnet
from pipeline.recipe.models import resnet

MODELS = parts.Table('model', 'model')
# The order is the docs' (configs-and-data.md) and the errors'.
MODELS.register(efficientnet.EfficientNet())
MODELS.register(resnet.ResNet())


def build_model(name, num_classes, image_size, dropout_rate=0.2,
                batch_norm_momentum=0.99, drop_connect_rate=0.2,
                weights=None, forms=None):
  """Returns a Keras model: uint8 [B, H, W, 3] images -> float32 logits.

  keras.applications fixes batch-norm momentum (0.99 in most), tuned for
  hundreds of ImageNet epochs; a short run needs faster-moving inference
  statistics, or eval (which uses them) lags far behind training accuracy.

  `weights`: None (random), 'imagenet' (Keras downloads its published
  headless weights) or a local weights file of the same headless network.
  `forms`: {'batch_norm', 'squeeze_excite', 'depthwise'} forms of those
  layers (layers.py; a run's come from its config, model_of_config), or
  None for keras.applications' own: the same weights either way, so what
  only reads or writes weights (an export, a source run's checkpoint)
  needs none.
  """
  family = MODELS[name]
  images = keras.Input((image_size, image_size, 3), dtype='uint8', name='image')
  # Rescaling(1) only casts uint8 to the policy's compute dtype on the device.
  x = keras.layers.Rescaling(1.0, name='to_float')(images)
  preprocessing = family.preprocessing(name)
  if preprocessing is not None:
    x = preprocessing(x)
  network = family.headless(name, weights, (image_size, image_size, 3))
  if forms:
    network = layers.swap(network, **forms)
  family.set_stochastic_depth(network, drop_connect_rate)
  for layer in network.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.momentum = batch_norm_momentum
  x = network(x)
  x = keras.layers.Dropout(dropout_rate, name='head_dropout')(x)
  logits = keras.layers.Dense(num_classes, dtype='float32', name='logits')(x)
  return keras.Model(images, logits, name=name)


def model_of_run(plan):
  """The run's network (build it inside the strategy's scope on TensorFlow)."""
  return model_of_config(plan.config, plan.source.num_classes)


def model_of_config(config, num_classes):
  """The network `config` describes, for `num_classes` (launch.probe's,
  which has no plan, and the run's)."""
  return build_model(config.model, num_classes, config.image_size,
                     config.dropout_rate, config.batch_norm_momentum,
                     config.drop_connect_rate,
                     forms=layers.forms_of(config))


def backbone(model):
  """The headless keras.applications network inside a build_model model."""
  nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
  assert len(nested) == 1, [layer.name for layer in model.layers]
  return nested[0]


def with_softmax(model):
  """The exported form: the same weights, float32 class probabilities out."""
  probabilities = keras.layers.Softmax(dtype='float32', name='probabilities')(
      model.output)
  return keras.Model(model.input, probabilities, name=model.name)
