"""EfficientNet B0-B7 and EfficientNetV2 (keras.applications), and
efficientnet_tiny: B0's first four stages, one block each, at a quarter
of its width, for a first check of a setup and the tests where the
network is not what is tested. Each normalises its own pixels (Rescaling and
Normalization inside)."""

import keras
# Private, as no public API builds an EfficientNet of other width and depth
# coefficients than B0-B7's.
from keras.src.applications import efficientnet

from pipeline.recipe.models.family import ModelFamily
from pipeline.recipe.models.family import no_published_weights

V1 = tuple(f'efficientnet_b{i}' for i in range(8))
V2 = tuple(f'efficientnetv2_{size}'
           for size in ('b0', 'b1', 'b2', 'b3', 's', 'm', 'l'))
TINY = 'efficientnet_tiny'
# B0's first four stages: every kind of block it has (expansion 1 and 6,
# 3x3 and 5x5 depthwise kernels, strides 1 and 2, a residual branch), one
# each. All seven stages traced and compiled for longer (a tiny run on 2
# cores, single runs: TensorFlow 31 -> 25 s, JAX about 60 -> 45 s) and
# learned digits no better; three stages were faster still (21 s, 34 s)
# but learned features too shallow to carry over: fine-tuning from them did
# no better than a random start (tests/test_finetune.py).
TINY_STAGES = efficientnet.DEFAULT_BLOCKS_ARGS[:4]
# Each network's own sizes: tensorflow/tpu trains and evaluates B0-B7 at
# one size each (models/official/efficientnet, efficientnet_builder.py's
# efficientnet_params); google/automl's efficientnetv2 trains at the first
# and evaluates at the second (effnetv2_configs.py's efficientnetv2_params).
# Keras' applications build each at its evaluation size (a test holds the
# two tables to them). The tiny network takes B0's.
V1_SIZES = dict(zip(V1, (224, 240, 260, 300, 380, 456, 528, 600)))
V2_SIZES = {'efficientnetv2_b0': (192, 224), 'efficientnetv2_b1': (192, 240),
            'efficientnetv2_b2': (208, 260), 'efficientnetv2_b3': (240, 300),
            'efficientnetv2_s': (300, 384), 'efficientnetv2_m': (384, 480),
            'efficientnetv2_l': (384, 480)}
# EfficientNetV2's first stage of progressive learning: the paper's Table 6
# (Tan and Le 2021), the same for S, M and L; their last is the run's own.
V2_FIRST_STAGE = {'image_size': 128, 'randaugment_magnitude': 5.0,
                  'mixup_alpha': 0.0, 'dropout_rate': 0.1}
V2_STAGES = 4  # The paper's ImageNet training: four stages.
# The stochastic depth keras.applications builds every EfficientNet with:
# block i of n drops its residual branch with probability 0.2 * i / n.
BUILT_DROP_CONNECT_RATE = 0.2


class EfficientNet(ModelFamily):
  """The EfficientNets of keras.applications, by name."""
  name = 'efficientnet'
  description = ('EfficientNet B0-B7 (efficientnet_b0 ... _b7), EfficientNetV2 '
                 '(efficientnetv2_b0 ... _b3, _s, _m, _l), and '
                 "efficientnet_tiny (B0's first 4 stages, a block each, at a "
                 'quarter width: for checks)')
  stochastic_depth = ('block i of n drops its residual branch with '
                      'probability about drop_connect_rate * i / n')

  def names(self):
    return (*V1, *V2, TINY)

  def headless(self, name, weights, input_shape):
    if name == TINY and weights:
      raise no_published_weights(name)
    return _constructor(name)(include_top=False, weights=weights,
                              pooling='avg', input_shape=input_shape)

  def with_its_top(self, name, num_classes, input_shape):
    return _constructor(name)(weights=None, classes=num_classes,
                              input_shape=input_shape)

  def image_sizes(self, name):
    if name in V2_SIZES:
      return (*V2_SIZES[name], "google/automl's EfficientNetV2 recipe")
    size = V1_SIZES.get(name, V1_SIZES['efficientnet_b0'])
    return size, size, ("tensorflow/tpu's EfficientNet recipe" if name in V1
                        else "B0's, tensorflow/tpu's recipe")

  def progressive_first(self, name):
    return dict(V2_FIRST_STAGE) if name in V2_SIZES else None

  def progressive_stages(self, name):
    return V2_STAGES if name in V2_SIZES else 0

  def published_file(self, name):
    """Keras 3's names: the network's own + '_notop.h5'
    (efficientnetb0_notop.h5, efficientnetv2-b0_notop.h5)."""
    if name == TINY:
      raise no_published_weights(name)
    family, size = name.split('_')
    return f'{family}{"-" if family.endswith("v2") else ""}{size}_notop.h5'

  def load(self, name, network, source, published):
    """Keras builds B0-B7 with ImageNet weights with one more layer, a
    rescaling of each channel by 1 / sqrt(its ImageNet deviation) after
    the Normalization (keras.applications' efficientnet.py, after
    tensorflow#49930); a network built without weights has none. So that
    it computes what Keras' ImageNet network computes, the rescaling is
    folded into the Normalization's variance."""
    super().load(name, network, source, published)
    if not (published and name in V1):
      return
    normalization = next(layer for layer in network.layers
                         if isinstance(layer, keras.layers.Normalization))
    normalization.adapt_variance.assign(
        normalization.adapt_variance * keras.ops.convert_to_tensor(
            efficientnet.IMAGENET_STDDEV_RGB))
    normalization.finalize_state()

  def set_stochastic_depth(self, network, rate):
    """The B0-B7 and V2 constructors do not pass a rate through, but each
    block's drop is a Dropout layer (noise shape [batch, 1, 1, 1]) whose
    rate is read when it runs: scaling those rates keeps
    keras.applications' linear growth with depth. Headless, the network
    has no other Dropout layer."""
    for layer in network.layers:
      if isinstance(layer, keras.layers.Dropout):
        layer.rate = layer.rate * rate / BUILT_DROP_CONNECT_RATE


def _constructor(name):
  """keras.applications' function that builds `name`."""
  if name == TINY:
    # Depth 0.1 rounds each stage's repeats up to one block.
    return lambda **kwargs: efficientnet.EfficientNet(
        0.25, 0.1, 224, name=TINY, blocks_args=TINY_STAGES, **kwargs)
  return getattr(keras.applications,
                 f'EfficientNetB{name[-1]}' if name in V1 else
                 f'EfficientNetV2{name.split("_")[1].upper()}')

