"""Three layers written so a compiled step reads each activation fewer times,
with Keras' variables, so every checkpoint, export and published weight
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

ShiftedDepthwiseConv2D: a depthwise convolution as the sum of its kernel's
taps, each a (strided) slice of the padded input times one weight per
channel. The convolution is memory-bound (a few multiply-adds per value
read), yet cuDNN's grouped kernels took 4.4 ms of an H200's 28.5 ms B0 step
for the forward pass alone (the probe's profile). As slices and products,
XLA can fuse it, and its data gradient (a sum of padded products), into
one elementwise pass each. It pays on a CPU (XLA:CPU's own depthwise data
gradient took 65% of the tiny network's step: 4.7x faster), not on an
H200 (0.80 of the step with cuDNN's kernels: XLA left the taps unfused,
362 MB moved an image against 258), so it is a CPU's form and 'conv'
stays the default.

Everything is keras.ops, so both backends run the same code.
"""

import dataclasses

import keras
from keras import ops

from pipeline import parts
from pipeline.errors import UserError


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


class ShiftedDepthwiseConv2D(keras.layers.DepthwiseConv2D):
  """keras.layers.DepthwiseConv2D computed tap by tap (channels last, one
  filter a channel, no dilation; Keras' own code otherwise). Same
  variables; products and sums in float32, as cuDNN accumulates."""

  def call(self, inputs):
    if not (self.depth_multiplier == 1 and
            self.data_format == 'channels_last' and
            tuple(self.dilation_rate) == (1, 1)):
      return super().call(inputs)
    (rows, columns), (row_step, column_step) = self.kernel_size, self.strides
    x = inputs
    if self.padding == 'same':
      x = ops.pad(x, ((0, 0), _same(x.shape[1], rows, row_step),
                      _same(x.shape[2], columns, column_step), (0, 0)))
    out_rows = (x.shape[1] - rows) // row_step + 1
    out_columns = (x.shape[2] - columns) // column_step + 1
    x = ops.cast(x, 'float32')  # Fused: XLA reads 16 bits, sums in 32.
    kernel = ops.cast(self.kernel, 'float32')
    total = 0.0
    for i in range(rows):
      for j in range(columns):
        total += x[:, i:i + row_step * (out_rows - 1) + 1:row_step,
                   j:j + column_step * (out_columns - 1) + 1:column_step,
                   :] * kernel[i, j, :, 0]
    outputs = ops.cast(total, self.compute_dtype)
    if self.use_bias:
      outputs = ops.add(outputs, self.bias)
    return self.activation(outputs) if self.activation else outputs


class Float32DepthwiseConv2D(keras.layers.DepthwiseConv2D):
  """keras.layers.DepthwiseConv2D computing in float32 under every policy
  (its inputs cast up, its outputs left in float32 for the next layer to
  cast down): for a CPU whose oneDNN runs the depthwise convolution and its
  filter gradient slowly in bfloat16 (4.2x float32's time on an AVX-512
  BF16 CPU without AMX) while the 1x1 convolutions gain. Same variables."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **dict(kwargs, dtype='float32'))


class _DirectDepthwiseConv2D(keras.layers.DepthwiseConv2D):
  """keras.layers.DepthwiseConv2D whose plain case (channels last, one
  filter a channel, no dilation) runs `_convolve`; Keras' own code
  otherwise. Same variables."""

  def _convolve(self, inputs, kernel, strides, padding):
    raise NotImplementedError

  def call(self, inputs):
    if not (self.depth_multiplier == 1 and
            self.data_format == 'channels_last' and
            tuple(self.dilation_rate) == (1, 1)):
      return super().call(inputs)
    strides = tuple(self.strides)
    padding = ((0, 0), (0, 0))
    if self.padding == 'same':
      padding = tuple(_same(size, kernel, stride) for size, kernel, stride in
                      zip(inputs.shape[1:3], self.kernel_size, strides))
    outputs = self._convolve(inputs, self.kernel[..., 0], strides, padding)
    if outputs is None:
      return super().call(inputs)
    if self.use_bias:
      outputs = ops.add(outputs, self.bias)
    return self.activation(outputs) if self.activation else outputs


class PallasDepthwiseConv2D(_DirectDepthwiseConv2D):
  """A direct depthwise kernel in Pallas on GPUs (depthwise_pallas.py);
  XLA's convolution where Pallas' GPU backend does not run, unless
  PIPELINE_PALLAS_INTERPRET=1 interprets the kernels (tests). JAX only."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.recipe import depthwise_pallas  # pylint: disable=g-import-not-at-top
    route = depthwise_pallas.pallas_route()
    if not route:
      return None
    return depthwise_pallas.pallas_depthwise(inputs, kernel, strides,
                                             padding, route == 'interpret')


class PallasForwardDepthwiseConv2D(_DirectDepthwiseConv2D):
  """PallasDepthwiseConv2D's forward kernel, XLA's gradients. JAX only."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.recipe import depthwise_pallas  # pylint: disable=g-import-not-at-top
    route = depthwise_pallas.pallas_route()
    if not route:
      return None
    return depthwise_pallas.pallas_forward_depthwise(
        inputs, kernel, strides, padding, route == 'interpret')


class StackedGradDepthwiseConv2D(_DirectDepthwiseConv2D):
  """XLA's depthwise convolution and data gradient, the filter gradient
  one reduction over the stacked taps (depthwise_xla.py). JAX only."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.recipe import depthwise_xla  # pylint: disable=g-import-not-at-top
    return depthwise_xla.stacked_grad_depthwise(inputs, kernel, strides,
                                                padding)


def _same(size, kernel, stride):
  """'same' padding of one axis as TensorFlow and cuDNN split it: the odd
  row or column after."""
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


# Keras' weights files (.weights.h5, the JAX route's checkpoints) file a
# layer's variables under its class's name, counted in order
# (batch_normalization_3/vars): under Keras' names, a checkpoint written by
# either form reads into the other.
for _layer, _keras_name in ((OnePassBatchNormalization, 'BatchNormalization'),
                            (Conv1x1AsMatmul, 'Conv2D'),
                            (ShiftedDepthwiseConv2D, 'DepthwiseConv2D'),
                            (Float32DepthwiseConv2D, 'DepthwiseConv2D'),
                            (PallasDepthwiseConv2D, 'DepthwiseConv2D'),
                            (PallasForwardDepthwiseConv2D, 'DepthwiseConv2D'),
                            (StackedGradDepthwiseConv2D, 'DepthwiseConv2D')):
  _layer.__name__ = _layer.__qualname__ = _keras_name

@dataclasses.dataclass(frozen=True, eq=False)
class Form(parts.Part):
  """A form of a layer by its config name: the layer class it builds."""
  name: str
  description: str
  layer: type
  # Written in JAX (a Pallas kernel, a jax.custom_vjp): TensorFlow cannot
  # compile it.
  jax_only: bool = False


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
    'shifted', 'for CPUs: a sum of shifted slices times per-channel weights '
    "(XLA:CPU's own depthwise gradient is slow: 4.7x faster there; on an "
    "H200 0.80 of cuDNN's, the taps unfused)", ShiftedDepthwiseConv2D))
DEPTHWISES.register(Form(
    'conv_in_float32', "Keras' own, computing in float32 under a 16-bit "
    'policy (for CPUs whose oneDNN runs depthwise slowly in bfloat16)',
    Float32DepthwiseConv2D))
DEPTHWISES.register(Form(
    'pallas', 'a direct kernel in Pallas on GPUs (forward and both '
    "gradients), XLA's convolution elsewhere; JAX only",
    PallasDepthwiseConv2D, jax_only=True))
DEPTHWISES.register(Form(
    'pallas_forward', "depthwise=pallas's forward kernel on GPUs, XLA's "
    'gradients; JAX only', PallasForwardDepthwiseConv2D, jax_only=True))
DEPTHWISES.register(Form(
    'stacked_grad', "XLA's convolution and data gradient, the filter "
    'gradient one reduction over the stacked taps; JAX only',
    StackedGradDepthwiseConv2D, jax_only=True))


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


def check_compiles(names, compiles_jax_only):
  """A one-line UserError for a form of `names` (the config's values of
  FORM_TABLES' keys, in order) written in JAX alone where the backend
  (`compiles_jax_only`: its Backend.compiles_jax_only) cannot compile it."""
  for table, name in zip(FORM_TABLES, names):
    if table[name].jax_only and not compiles_jax_only:
      raise UserError(
          f'{table.key}={name} is written in JAX and trains on '
          '--backend=jax only; on TensorFlow use '
          f'{", ".join(f.name for f in table.parts() if not f.jax_only)}')


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
