"""The depthwise forms the probe times against Keras' own convolution, as
variants (`--variant=depthwise=pallas`, `--config.depthwise=pallas`): each
an experiment until a GPU measures it at least as fast as Keras' own
convolution in the step, when it moves into the layer forms (pipeline/recipe/layers.py). On
an H200 each lost: pallas 0.79 of the step with cuDNN's kernels,
pallas_forward 0.78, shifted 0.80 (XLA left its taps unfused, 362 MB
moved an image against 258). `register` adds them to layers.DEPTHWISES
for the probe's process alone; each keeps Keras' variables and
names, so a weights file reads across every form.

shifted: a depthwise convolution as the sum of its kernel's taps, each a
(strided) slice of the padded input times one weight per channel, which
XLA can fuse with its data gradient into one elementwise pass each (on
XLA:CPU 4.7x faster than its own depthwise gradient in the tiny network).
pallas: a direct kernel in Pallas, forward and both gradients
(depthwise_pallas.py); pallas_forward: its forward kernel, XLA's
gradients; stacked_grad: XLA's convolution and data gradient, the filter
gradient one reduction over the stacked taps (depthwise_xla.py).
"""

import keras
from keras import ops

from pipeline.recipe import layers


def _same(size, kernel, stride):
  """'same' padding of one axis as TensorFlow and cuDNN split it: the odd
  row or column after."""
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


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
  """A direct depthwise kernel in Pallas on GPUs; XLA's convolution where
  Pallas' GPU backend does not run, unless PIPELINE_PALLAS_INTERPRET=1
  interprets the kernels (tests)."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.probe import depthwise_pallas  # pylint: disable=g-import-not-at-top
    route = depthwise_pallas.pallas_route()
    if not route:
      return None
    return depthwise_pallas.pallas_depthwise(inputs, kernel, strides,
                                             padding, route == 'interpret')


class PallasForwardDepthwiseConv2D(_DirectDepthwiseConv2D):
  """PallasDepthwiseConv2D's forward kernel, XLA's gradients."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.probe import depthwise_pallas  # pylint: disable=g-import-not-at-top
    route = depthwise_pallas.pallas_route()
    if not route:
      return None
    return depthwise_pallas.pallas_forward_depthwise(
        inputs, kernel, strides, padding, route == 'interpret')


class StackedGradDepthwiseConv2D(_DirectDepthwiseConv2D):
  """XLA's depthwise convolution and data gradient, the filter gradient
  one reduction over the stacked taps."""

  def _convolve(self, inputs, kernel, strides, padding):
    from pipeline.probe import depthwise_xla  # pylint: disable=g-import-not-at-top
    return depthwise_xla.stacked_grad_depthwise(inputs, kernel, strides,
                                                padding)


# Under Keras' class name each files its variables as Keras' own does
# (depthwise_conv2d_3/vars), so a checkpoint of any form reads into 'conv'.
EXPERIMENTS = (
    layers.Form('shifted', 'a sum of shifted slices times per-channel '
                'weights', ShiftedDepthwiseConv2D),
    layers.Form('pallas', "a direct kernel in Pallas on GPUs (forward and "
                "both gradients), XLA's convolution elsewhere",
                PallasDepthwiseConv2D),
    layers.Form('pallas_forward', "depthwise=pallas's forward kernel on "
                "GPUs, XLA's gradients", PallasForwardDepthwiseConv2D),
    layers.Form('stacked_grad', "XLA's convolution and data gradient, the "
                'filter gradient one reduction over the stacked taps',
                StackedGradDepthwiseConv2D))
for _form in EXPERIMENTS:
  _form.layer.__name__ = _form.layer.__qualname__ = 'DepthwiseConv2D'


def register():
  """Adds the experiments to layers.DEPTHWISES in this process (once), so
  --config.depthwise and a variant's depthwise= name them."""
  for form in EXPERIMENTS:
    if form.name not in layers.DEPTHWISES:
      layers.DEPTHWISES.register(form)
