"""EfficientNet B0-B7 with a float32 head, taking uint8 images.

keras.applications' EfficientNet rescales and normalises inside the model, so
the input pipeline can ship uint8 pixels (a quarter of float32's bytes) and
the cast happens on the device. Its own top would run softmax in the compute
dtype, so we build it headless and add a float32 head: logits and loss stay
float32 under every policy.
"""

import keras

from pipeline.errors import UserError

MODELS = {
    f'efficientnet_b{i}': getattr(keras.applications, f'EfficientNetB{i}')
    for i in range(8)
}


def build_model(name, num_classes, image_size, dropout_rate=0.2,
                batch_norm_momentum=0.99):
  """Returns a Keras model: uint8 [B, H, W, 3] images -> float32 logits.

  keras.applications fixes batch-norm momentum at 0.99, tuned for hundreds of
  ImageNet epochs; a short run needs faster-moving inference statistics, or
  eval (which uses them) lags far behind training accuracy.
  """
  if name not in MODELS:
    raise UserError(f'unknown model {name!r}; accepted: {", ".join(MODELS)}')
  if image_size < 32:
    raise UserError(f'image_size={image_size} is too small for EfficientNet; '
                    'use 32 or more')
  images = keras.Input((image_size, image_size, 3), dtype='uint8', name='image')
  # Rescaling(1) only casts uint8 to the policy's compute dtype on the device.
  x = keras.layers.Rescaling(1.0, name='to_float')(images)
  backbone = MODELS[name](include_top=False, weights=None, pooling='avg',
                          input_shape=(image_size, image_size, 3))
  for layer in backbone.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.momentum = batch_norm_momentum
  x = backbone(x)
  x = keras.layers.Dropout(dropout_rate, name='head_dropout')(x)
  logits = keras.layers.Dense(num_classes, dtype='float32', name='logits')(x)
  return keras.Model(images, logits, name=name)


def with_softmax(model):
  """The exported form: the same weights, float32 class probabilities out."""
  probabilities = keras.layers.Softmax(dtype='float32', name='probabilities')(
      model.output)
  return keras.Model(model.input, probabilities, name=model.name)
