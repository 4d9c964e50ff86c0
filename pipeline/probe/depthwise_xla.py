"""Depthwise convolutions by XLA (cuDNN's grouped kernels on a GPU): the
reference depthwise=pallas is tested against, and depthwise=stacked_grad,
XLA's convolution and data gradient with the filter gradient written as
one reduction over the K*K taps stacked (a multiply and a sum XLA fuses,
reading the input and the output gradient once): whether the filter
gradient alone closes the gap to the card's bandwidth, for the price of
no kernel. NHWC, one filter a channel, float32 accumulation. JAX only.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp


def xla_depthwise(x, w, strides, padding):
  """The same convolution by XLA (cuDNN's grouped kernels on a GPU),
  float32 accumulation: the reference the kernels are tested against."""
  return lax.conv_general_dilated(
      x, w[:, :, None, :], strides, padding,
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      feature_group_count=x.shape[-1],
      preferred_element_type=jnp.float32).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def stacked_grad_depthwise(x, w, strides, padding):
  """xla_depthwise, whose filter gradient is one reduction over the
  stacked taps instead of XLA's grouped backward-filter convolution."""
  return xla_depthwise(x, w, strides, padding)


def _stacked_forward(x, w, strides, padding):
  return stacked_grad_depthwise(x, w, strides, padding), (x, w)


def _stacked_backward(strides, padding, saved, dy):
  x, w = saved
  _, data_vjp = jax.vjp(lambda x_: xla_depthwise(x_, w, strides, padding), x)
  (dx,) = data_vjp(dy)
  padded = jnp.pad(x, ((0, 0), *padding, (0, 0)))
  (rows, columns), (row_step, column_step) = w.shape[:2], strides
  out_rows, out_columns = dy.shape[1:3]
  taps = jnp.stack([
      padded[:, i:i + row_step * (out_rows - 1) + 1:row_step,
             j:j + column_step * (out_columns - 1) + 1:column_step, :]
      for i in range(rows) for j in range(columns)])
  dw = jnp.sum(taps.astype(jnp.float32) * dy.astype(jnp.float32)[None],
               axis=(1, 2, 3))
  return dx, dw.reshape(w.shape).astype(w.dtype)


stacked_grad_depthwise.defvjp(_stacked_forward, _stacked_backward)
