"""Three layers written so a compiled step runs faster (reads each activation
fewer times, or computes where the hardware is fast), with Keras' variables, so every checkpoint, export and published weight
file reads into them unchanged; and the swap that puts them into a built
network.

OnePassBatchNormalization: Keras 3.15's BatchNormalization computes the
mean, then the variance from it (two dependent passes over each
convolution's output, in float32), and its gradient is whatever XLA derives
from that. Here the mean and variance come from one pass of sums of the
input shifted by one of the batch's own values per channel (Keras left the
unshifted one-pass form for the NaNs its cancellation made: keras#18795,
keras#19072). A value of the batch lies within a few deviations of its
mean, so the shifted sums stay small and the difference of them exact from
the first step; the moving mean, the shift once used here, is 0 at the
first step, where the form was the unshifted one and off by 6% at a
mean 1,000 times the spread), and the gradient is written
out: one combined reduction of the output gradient and the normalised
input, then one elementwise pass, saving only the 16-bit input and the
per-channel mean and inverse deviation.

Conv1x1AsMatmul: squeeze-and-excite's 1x1 convolutions run on a 1x1 map,
so each is a matrix product over [batch, channels]. As convolutions they
are launched as cuDNN calls (forward, data and filter gradient) on
channels as few as 4; as products XLA fuses them with their neighbours.

Float32DepthwiseConv2D: Keras' depthwise convolution computing in float32
under a 16-bit policy, for CPUs whose oneDNN runs it slowly in bfloat16.

The depthwise forms a GPU measured slower than Keras' own in the step
(shifted, pallas, pallas_forward, stacked_grad) live in the probe
(pipeline/probe/depthwise_forms.py) until one measures faster.

Everything is keras.ops, so both backends run the same code.
"""

import dataclasses

import keras
from keras import ops

from pipeline import parts


@ops.custom_gradient
def _normalize(x, mean, inverse_deviation, gamma, beta):
  """(x - mean) * inverse_deviation * gamma + beta in float32, in x's dtype.
  `mean` and `inverse_deviation` are the batch's, computed from x by the
  caller (and not differentiated there): the gradient below is batch
  norm's whole gradient with respect to x."""
  scale = inverse_deviation * gamma
  y = (ops.cast(x, 'float32') - mean) * scale + beta

  def gradient(upstream):
    dy = ops.cast(upstream, 'float32')
    axes = tuple(range(len(x.shape) - 1))
    normalized = (ops.cast(x, 'float32') - mean) * inverse_deviation
    # One reduction pass (XLA makes both sums one fusion), then one
    # elementwise pass.
    dbeta = ops.sum(dy, axis=axes)
    dgamma = ops.sum(dy * normalized, axis=axes)
    count = ops.cast(ops.size(dy) // dy.shape[-1], 'float32')
    dx = scale * (dy - (dbeta + normalized * dgamma) / count)
    return (ops.cast(dx, x.dtype), ops.zeros_like(mean),
            ops.zeros_like(inverse_deviation), dgamma, dbeta)

  return ops.cast(y, x.dtype), gradient


class OnePassBatchNormalization(keras.layers.BatchNormalization):
  """keras.layers.BatchNormalization with one-pass statistics shifted by a
  value of the batch and a written-out gradient while training; Keras' own
  code otherwise (inference, masks, renorm, a frozen layer). Same variables, same moving-statistics
  rule, same results within float32 rounding."""

  def call(self, inputs, training=None, mask=None):
    if not (training and self.trainable and self.scale and self.center and
            mask is None and not self.renorm and not self.synchronized and
            self.axis in (-1, len(inputs.shape) - 1)):
      return super().call(inputs, training=training, mask=mask)
    axes = tuple(range(len(inputs.shape) - 1))
    # The first position's values: one of the batch's own per channel.
    shift = ops.stop_gradient(ops.cast(inputs[(0,) * len(axes)], 'float32'))
    shifted = ops.cast(inputs, 'float32') - shift
    offset = ops.mean(shifted, axis=axes)
    variance = ops.maximum(
        ops.mean(ops.square(shifted), axis=axes) - ops.square(offset), 0.0)
    mean = ops.stop_gradient(shift + offset)
    variance = ops.stop_gradient(variance)
    outputs = _normalize(inputs, mean,
                         ops.rsqrt(variance + self.epsilon),
                         ops.cast(self.gamma, 'float32'),
                         ops.cast(self.beta, 'float32'))
    self.moving_mean.assign(self.moving_mean * self.momentum +
                            mean * (1.0 - self.momentum))
    self.moving_variance.assign(self.moving_variance * self.momentum +
                                variance * (1.0 - self.momentum))
    return ops.cast(outputs, self.compute_dtype)


class Conv1x1AsMatmul(keras.layers.Conv2D):
  """keras.layers.Conv2D of a 1x1 kernel on a 1x1 map, computed as a
  matrix product. Same variables (kernel [1, 1, in, out], bias)."""

  def call(self, inputs):
    batch_shape = ops.shape(inputs)[:-1]
    x = ops.reshape(inputs, (-1, inputs.shape[-1]))
    outputs = ops.matmul(x, ops.reshape(self.kernel, self.kernel.shape[2:]))
    if self.use_bias:
      outputs = ops.add(outputs, self.bias)
    outputs = ops.reshape(outputs, (*batch_shape, self.filters))
    return self.activation(outputs) if self.activation else outputs


class Float32DepthwiseConv2D(keras.layers.DepthwiseConv2D):
  """keras.layers.DepthwiseConv2D computing in float32 under every policy
  (its inputs cast up, its outputs left in float32 for the next layer to
  cast down): for a CPU whose oneDNN runs the depthwise convolution and its
  filter gradient slowly in bfloat16 (4.2x float32's time on an AVX-512
  BF16 CPU without AMX) while the 1x1 convolutions gain. Same variables."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **dict(kwargs, dtype='float32'))


# Keras' weights files (.weights.h5, the JAX route's checkpoints) file a
# layer's variables under its class's name, counted in order
# (batch_normalization_3/vars): under Keras' names, a checkpoint written by
# either form reads into the other.
for _layer, _keras_name in ((OnePassBatchNormalization, 'BatchNormalization'),
                            (Conv1x1AsMatmul, 'Conv2D'),
                            (Float32DepthwiseConv2D, 'DepthwiseConv2D')):
  _layer.__name__ = _layer.__qualname__ = _keras_name


@dataclasses.dataclass(frozen=True, eq=False)
class Form(parts.Part):
  """A form of a layer by its config name: the layer class it builds."""
  name: str
  description: str
  layer: type


# config.batch_norm, config.squeeze_excite and config.depthwise: each form's
# layer class.
BATCH_NORMS = parts.Table('batch norm', 'batch_norm')
BATCH_NORMS.register(Form(
    'one_pass', 'statistics in one pass of shifted sums, a written-out '
    'gradient (one reduction, one elementwise pass)',
    OnePassBatchNormalization))
BATCH_NORMS.register(Form('keras', "Keras' own (two passes)",
                          keras.layers.BatchNormalization))
SQUEEZE_EXCITES = parts.Table('squeeze-excite form', 'squeeze_excite')
SQUEEZE_EXCITES.register(Form(
    'matmul', "squeeze-and-excite's 1x1 convolutions on a 1x1 map as matrix "
    'products', Conv1x1AsMatmul))
SQUEEZE_EXCITES.register(Form('conv', 'as convolutions (keras.applications)',
                              keras.layers.Conv2D))
DEPTHWISES = parts.Table('depthwise convolution form', 'depthwise')
DEPTHWISES.register(Form(
    'conv', "Keras' own (cuDNN's grouped convolution on a GPU)",
    keras.layers.DepthwiseConv2D))
DEPTHWISES.register(Form(
    'conv_in_float32', "Keras' own, computing in float32 under a 16-bit "
    'policy (for CPUs whose oneDNN runs depthwise slowly in bfloat16)',
    Float32DepthwiseConv2D))


def _on_a_pixel(layer):
  """A 1x1, stride-1, ungrouped, channels-last Conv2D on a 1x1 map."""
  return (type(layer) is keras.layers.Conv2D and  # pylint: disable=unidiomatic-typecheck
          tuple(layer.kernel_size) == (1, 1) and
          tuple(layer.strides) == (1, 1) and layer.groups == 1 and
          layer.data_format == 'channels_last' and
          tuple(layer.input.shape[1:3]) == (1, 1))


# The tables of layer forms, each by its config key (configs/default.py
# holds their defaults), as swap takes them.
FORM_TABLES = (BATCH_NORMS, SQUEEZE_EXCITES, DEPTHWISES)


def swap(network, batch_norm, squeeze_excite, depthwise):
  """`network` (a functional Keras model) with its batch norms, 1x1
  convolutions on a 1x1 map and depthwise convolutions replaced by the
  named forms, its weights and layer names kept; `network` itself where
  nothing changes."""
  norm = BATCH_NORMS[batch_norm].layer
  conv = SQUEEZE_EXCITES[squeeze_excite].layer
  depthwise_conv = DEPTHWISES[depthwise].layer

  def replace(layer):
    if type(layer) is keras.layers.BatchNormalization:  # pylint: disable=unidiomatic-typecheck
      return norm.from_config(layer.get_config())
    if _on_a_pixel(layer):
      return conv.from_config(layer.get_config())
    if type(layer) is keras.layers.DepthwiseConv2D:  # pylint: disable=unidiomatic-typecheck
      return depthwise_conv.from_config(layer.get_config())
    return layer.__class__.from_config(layer.get_config())

  if (norm is keras.layers.BatchNormalization and
      conv is keras.layers.Conv2D and
      depthwise_conv is keras.layers.DepthwiseConv2D):
    return network
  clone = keras.models.clone_model(network, clone_function=replace)
  clone.set_weights(network.get_weights())
  for layer in clone.layers:
    # Layers that derive constants from their variables when loaded
    # (Normalization's mean and variance) derive them again.
    if hasattr(layer, 'finalize_state'):
      layer.finalize_state()
  return clone
