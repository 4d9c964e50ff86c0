"""EfficientNet B0-B7 and EfficientNetV2 with a float32 head, taking uint8.

keras.applications' EfficientNets rescale and normalise inside the model, so
the input pipeline can ship uint8 pixels (a quarter of float32's bytes) and
the cast happens on the device. Their own top would run softmax in the
compute dtype, so we build them headless and add a float32 head: logits and
loss stay float32 under every policy. The headless network is one nested
layer, `backbone(model)`: what fine-tuning loads and freezes.
"""

import keras
# Private, as no public API builds an EfficientNet of other width and depth
# coefficients than B0-B7's.
from keras.src.applications import efficientnet

from pipeline.recipe import layers


def efficientnet_tiny(weights=None, **kwargs):
  """B0's blocks at a quarter of its width and a tenth of its depth (one
  block a stage; 131 k parameters against 4 M): the same code, compiled
  in half the time and trained 4x faster. For a first check of a setup,
  and the tests where the network is not what is tested. No published
  weights."""
  if weights:
    raise ValueError('efficientnet_tiny has no published ImageNet weights')
  return efficientnet.EfficientNet(0.25, 0.1, 224, name='efficientnet_tiny',
                                   weights=None, **kwargs)


MODELS = {
    **{f'efficientnet_b{i}': getattr(keras.applications, f'EfficientNetB{i}')
       for i in range(8)},
    **{f'efficientnetv2_{size}': getattr(keras.applications,
                                         f'EfficientNetV2{size.upper()}')
       for size in ('b0', 'b1', 'b2', 'b3', 's', 'm', 'l')},
    'efficientnet_tiny': efficientnet_tiny,
}
# The stochastic depth keras.applications builds every EfficientNet with:
# block i of n drops its residual branch with probability 0.2 * i / n.
BUILT_DROP_CONNECT_RATE = 0.2


def build_model(name, num_classes, image_size, dropout_rate=0.2,
                batch_norm_momentum=0.99, drop_connect_rate=0.2,
                weights=None, batch_norm='keras', squeeze_excite='conv'):
  """Returns a Keras model: uint8 [B, H, W, 3] images -> float32 logits.

  keras.applications fixes batch-norm momentum at 0.99, tuned for hundreds of
  ImageNet epochs; a short run needs faster-moving inference statistics, or
  eval (which uses them) lags far behind training accuracy.

  `weights`: None (random), 'imagenet' (Keras downloads its published
  headless weights) or a local weights file of the same headless network.
  `batch_norm`, `squeeze_excite`: the forms of those layers (layers.py;
  'keras' and 'conv' are keras.applications' own).
  """
  images = keras.Input((image_size, image_size, 3), dtype='uint8', name='image')
  # Rescaling(1) only casts uint8 to the policy's compute dtype on the device.
  x = keras.layers.Rescaling(1.0, name='to_float')(images)
  network = MODELS[name](include_top=False, weights=weights, pooling='avg',
                         input_shape=(image_size, image_size, 3))
  network = layers.swap(network, batch_norm, squeeze_excite)
  set_drop_connect_rate(network, drop_connect_rate)
  for layer in network.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.momentum = batch_norm_momentum
  x = network(x)
  x = keras.layers.Dropout(dropout_rate, name='head_dropout')(x)
  logits = keras.layers.Dense(num_classes, dtype='float32', name='logits')(x)
  return keras.Model(images, logits, name=name)


def model_of_run(plan):
  """The run's network (build it inside the strategy's scope on TensorFlow)."""
  config = plan.config
  return build_model(config.model, plan.source.num_classes, config.image_size,
                     config.dropout_rate, config.batch_norm_momentum,
                     config.drop_connect_rate, batch_norm=config.batch_norm,
                     squeeze_excite=config.squeeze_excite)


def set_drop_connect_rate(network, rate):
  """Scales every block's stochastic depth so the deepest reaches `rate`.

  The B0-B7 and V2 constructors do not pass a rate through, but each block's
  drop is a Dropout layer (noise shape [batch, 1, 1, 1]) whose rate is read
  when it runs: scaling those rates keeps keras.applications' linear growth
  with depth. Headless, the network has no other Dropout layer.
  """
  for layer in network.layers:
    if isinstance(layer, keras.layers.Dropout):
      layer.rate = layer.rate * rate / BUILT_DROP_CONNECT_RATE


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
