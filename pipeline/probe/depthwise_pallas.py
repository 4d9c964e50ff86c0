"""depthwise=pallas: a direct depthwise convolution in Pallas (its Triton
backend on GPUs), forward, data gradient and filter gradient under one
jax.custom_vjp; NHWC, one filter a channel, float32 accumulation whatever
the input's dtype. depthwise=pallas_forward keeps its forward kernel and
takes XLA's gradients.

cuDNN runs a depthwise convolution as C groups of one channel, tiny matrix
products; in an H200's B0 step the forward ran at about 15% of the card's
bandwidth and the filter gradient at about 28%. The operation is a few
multiply-adds per value read, so a kernel that reads each input once, its
taps from cache, is bound by the card's bandwidth alone. Each program
holds one output row's tile of columns x channels, channels contiguous
(the loads coalesce), a power of two each as Triton wants, the tails
masked. The filter gradient reduces a run of rows per program into
partial sums, which XLA adds up.

Importing this module imports JAX: the layers import it only on that
backend. `interpret=True` runs a kernel's body on any device (the CPU's
tests: numerics, not speed).
"""

import dataclasses
import functools
import math
import os

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pipeline.probe.depthwise_xla import xla_depthwise

# Programs of the filter gradient: a few per multiprocessor of a large GPU
# (132 on an H100 or H200), each reducing a run of rows.
_FILTER_GRADIENT_PROGRAMS = 512
# The largest tile a forward or data-gradient program holds (columns x
# channels): 64 channels of bfloat16 are a 128-byte line.
_TILE = 2048
_CHANNELS = 64
# The filter gradient's accumulators, one a tap, fill a program's
# registers (128 threads): at most this many float32 values in all.
_ACCUMULATED = 8192


# Set to 1, the Pallas form runs its kernels interpreted where there is no
# GPU (tests, and launch.probe on a CPU) instead of leaving the
# convolution to XLA.
INTERPRET_VARIABLE = 'PIPELINE_PALLAS_INTERPRET'


def pallas_route():
  """How the Pallas form runs here: 'triton' on a GPU, 'interpret' where
  INTERPRET_VARIABLE asks, None (XLA's convolution) elsewhere: Pallas'
  TPU backend compiles other kernels than these."""
  if jax.default_backend() == 'gpu':
    return 'triton'
  return 'interpret' if os.environ.get(INTERPRET_VARIABLE) == '1' else None


def _pow2(n):
  """The least power of two >= n."""
  return 1 << max(n - 1, 0).bit_length()


def _pow2_below(n):
  """The greatest power of two <= n (1 at least)."""
  return 1 << max(n, 1).bit_length() - 1


@dataclasses.dataclass(frozen=True)
class Geometry:
  """A depthwise convolution's shapes: input NHWC, kernel, strides, the
  padding before each axis, and the output's rows and columns."""
  batch: int
  rows: int
  columns: int
  channels: int
  kernel: tuple  # (rows, columns)
  strides: tuple
  before: tuple  # Padding above and left of the input.
  out_rows: int
  out_columns: int

  @classmethod
  def of(cls, x_shape, kernel, strides, padding):
    """`padding`: ((top, bottom), (left, right)) around the input."""
    batch, rows, columns, channels = x_shape
    (top, bottom), (left, right) = padding
    return cls(batch, rows, columns, channels, tuple(kernel), tuple(strides),
               (top, left),
               (rows + top + bottom - kernel[0]) // strides[0] + 1,
               (columns + left + right - kernel[1]) // strides[1] + 1)

  def taps(self):
    return [(i, j) for i in range(self.kernel[0])
            for j in range(self.kernel[1])]


@dataclasses.dataclass(frozen=True)
class _Tile:
  """One program's block: `columns` x `channels`, powers of two."""
  columns: int
  channels: int

  @classmethod
  def of(cls, columns, channels, elements=_TILE, most_channels=_CHANNELS):
    """The tile for `columns` x `channels` of at most `elements`."""
    channels = min(_pow2(channels), most_channels)
    return cls(min(_pow2(columns), _pow2_below(elements // channels)),
               channels)

  def blocks(self, columns, channels):
    return pl.cdiv(columns, self.columns), pl.cdiv(channels, self.channels)

  def indices(self, column_block, channel_block):
    """[columns, channels] index arrays of the block, and the channels'
    own [channels] vector."""
    shape = (self.columns, self.channels)
    channel_vector = channel_block * self.channels + jnp.arange(self.channels)
    columns = column_block * self.columns + lax.broadcasted_iota(
        jnp.int32, shape, 0)
    return columns, jnp.broadcast_to(channel_vector[None, :], shape), (
        channel_vector)


def _divmod(index, size):
  """(index // size, index % size) of a nonnegative traced int, as lax's
  division (jnp's floor division adds sign fix-ups Triton's lowering
  refuses inside a loop)."""
  return lax.div(index, size), lax.rem(index, size)


def _split(program, *sizes):
  """The index of each grid axis of `sizes` (the last fastest) from one
  flat program id."""
  indices = []
  for size in reversed(sizes):
    program, index = _divmod(program, size)
    indices.append(index)
  return indices[::-1]


def _depthwise_forward_kernel(x_ref, w_ref, y_ref, *, g, tile):
  """y[n, r, :, :] for one output row r, one block of columns and
  channels: the sum over taps of the input's shifted (strided) block
  times the tap's weights."""
  column_blocks, channel_blocks = tile.blocks(g.out_columns, g.channels)
  row, column_block, channel_block = _split(
      pl.program_id(0), g.batch * g.out_rows, column_blocks, channel_blocks)
  n, out_row = _divmod(row, g.out_rows)
  columns, channels, channel_vector = tile.indices(column_block,
                                                   channel_block)
  in_channels = channels < g.channels
  total = jnp.zeros((tile.columns, tile.channels), jnp.float32)
  for i, j in g.taps():
    source_row = out_row * g.strides[0] + i - g.before[0]
    source = columns * g.strides[1] + j - g.before[1]
    inside = ((source_row >= 0) & (source_row < g.rows) & (source >= 0) &
              (source < g.columns) & in_channels)
    x = plgpu.load(x_ref.at[n, source_row, source, channels], mask=inside,
                other=0)
    w = plgpu.load(w_ref.at[i, j, channel_vector],
                mask=channel_vector < g.channels, other=0)
    total += x.astype(jnp.float32) * w.astype(jnp.float32)[None, :]
  plgpu.store(y_ref.at[n, out_row, columns, channels], total.astype(y_ref.dtype),
           mask=(columns < g.out_columns) & in_channels)


def _source(index, before, tap, stride, size):
  """(output index, is there one) that input `index` meets at `tap`:
  index + before - tap = output * stride, within [0, size)."""
  reached = index + before - tap
  if stride == 1:
    return reached, (reached >= 0) & (reached < size)
  out = lax.div(reached, stride)
  return out, ((reached >= 0) & (lax.rem(reached, stride) == 0) &
               (out < size))


def _depthwise_data_gradient_kernel(dy_ref, w_ref, dx_ref, *, g, tile):
  """dx[n, r, :, :] for one input row r: every output the row's values
  reached, times the tap that reached it."""
  column_blocks, channel_blocks = tile.blocks(g.columns, g.channels)
  row, column_block, channel_block = _split(
      pl.program_id(0), g.batch * g.rows, column_blocks, channel_blocks)
  n, in_row = _divmod(row, g.rows)
  columns, channels, channel_vector = tile.indices(column_block,
                                                   channel_block)
  in_channels = channels < g.channels
  total = jnp.zeros((tile.columns, tile.channels), jnp.float32)
  for i, j in g.taps():
    out_row, row_ok = _source(in_row, g.before[0], i, g.strides[0],
                              g.out_rows)
    out_columns, column_ok = _source(columns, g.before[1], j, g.strides[1],
                                     g.out_columns)
    dy = plgpu.load(dy_ref.at[n, out_row, out_columns, channels],
                 mask=row_ok & column_ok & in_channels, other=0)
    w = plgpu.load(w_ref.at[i, j, channel_vector],
                mask=channel_vector < g.channels, other=0)
    total += dy.astype(jnp.float32) * w.astype(jnp.float32)[None, :]
  plgpu.store(dx_ref.at[n, in_row, columns, channels],
           total.astype(dx_ref.dtype),
           mask=(columns < g.columns) & in_channels)


def _depthwise_filter_gradient_kernel(x_ref, dy_ref, partial_ref, *, g,
                                      tile, rows_each, reduce_each_step):
  """partial[p, tap, channels]: for one run of `rows_each` output rows and
  one block of channels, the sum over them of the output gradient times
  the input each tap read; a tile's columns summed at every step where
  `reduce_each_step` (a larger tile, fewer accumulators), else at the
  end."""
  column_blocks, channel_blocks = tile.blocks(g.out_columns, g.channels)
  run, channel_block = _divmod(pl.program_id(0), channel_blocks)
  _, channels, channel_vector = tile.indices(0, channel_block)
  in_channels = channels < g.channels
  taps = g.taps()

  def accumulate(step, totals):
    row_step, column_block = _divmod(step, column_blocks)
    row = run * rows_each + row_step
    n, out_row = _divmod(row, g.out_rows)
    columns = column_block * tile.columns + lax.broadcasted_iota(
        jnp.int32, channels.shape, 0)
    valid = (row < g.batch * g.out_rows) & (columns < g.out_columns) & (
        in_channels)
    dy = plgpu.load(dy_ref.at[n, out_row, columns, channels], mask=valid,
                 other=0).astype(jnp.float32)
    sums = []
    for (i, j), total in zip(taps, totals):
      source_row = out_row * g.strides[0] + i - g.before[0]
      source = columns * g.strides[1] + j - g.before[1]
      inside = (valid & (source_row >= 0) & (source_row < g.rows) &
                (source >= 0) & (source < g.columns))
      x = plgpu.load(x_ref.at[n, source_row, source, channels], mask=inside,
                  other=0)
      product = dy * x.astype(jnp.float32)
      sums.append(total + (product.sum(axis=0) if reduce_each_step
                           else product))
    return tuple(sums)

  zeros = jnp.zeros((tile.channels,) if reduce_each_step else
                    (tile.columns, tile.channels), jnp.float32)
  totals = lax.fori_loop(0, rows_each * column_blocks, accumulate,
                         (zeros,) * len(taps))
  for index, total in enumerate(totals):
    plgpu.store(partial_ref.at[run, index, channel_vector],
                total if reduce_each_step else total.sum(axis=0),
                mask=channel_vector < g.channels)


# Named, so jax 0.9-0.11.0 lower through Triton too, not Mosaic GPU.
TRITON_PARAMS = plgpu.CompilerParams(num_warps=4, num_stages=3)


def _call(kernel, grid, out_shape, interpret, **params):
  return pl.pallas_call(functools.partial(kernel, **params),
                        out_shape=out_shape, grid=(grid,),
                        interpret=interpret, compiler_params=TRITON_PARAMS)


def forward(x, w, g, interpret, elements=_TILE, most_channels=_CHANNELS):
  """The convolution of x [N, H, W, C] with w [kh, kw, C], in x's dtype;
  a program's tile at most `elements`, `most_channels` wide."""
  tile = _Tile.of(g.out_columns, g.channels, elements, most_channels)
  grid = g.batch * g.out_rows * math.prod(tile.blocks(g.out_columns,
                                                      g.channels))
  out = jax.ShapeDtypeStruct((g.batch, g.out_rows, g.out_columns,
                              g.channels), x.dtype)
  return _call(_depthwise_forward_kernel, grid, out, interpret, g=g,
               tile=tile)(x, w)


def data_gradient(dy, w, g, dtype, interpret, elements=_TILE,
                  most_channels=_CHANNELS):
  """d loss / d x from dy [N, Ho, Wo, C], in `dtype`."""
  tile = _Tile.of(g.columns, g.channels, elements, most_channels)
  grid = g.batch * g.rows * math.prod(tile.blocks(g.columns, g.channels))
  out = jax.ShapeDtypeStruct((g.batch, g.rows, g.columns, g.channels), dtype)
  return _call(_depthwise_data_gradient_kernel, grid, out, interpret, g=g,
               tile=tile)(dy, w)


def filter_gradient(x, dy, g, interpret, accumulated=_ACCUMULATED,
                    most_channels=32, programs=_FILTER_GRADIENT_PROGRAMS,
                    reduce_each_step=False):
  """d loss / d w [kh, kw, C], float32: runs of rows reduced by about
  `programs` programs, their partial sums added by XLA. `accumulated`:
  the float32 values a program accumulates (a tile per tap, or a tile
  summed at each step where `reduce_each_step`)."""
  elements = accumulated if reduce_each_step else (
      accumulated // len(g.taps()))
  tile = _Tile.of(g.out_columns, g.channels, elements, most_channels)
  _, channel_blocks = tile.blocks(g.out_columns, g.channels)
  out_rows = g.batch * g.out_rows
  runs = max(1, min(out_rows, programs // channel_blocks))
  rows_each = pl.cdiv(out_rows, runs)
  runs = pl.cdiv(out_rows, rows_each)
  partial = jax.ShapeDtypeStruct((runs, len(g.taps()), g.channels),
                                 jnp.float32)
  sums = _call(_depthwise_filter_gradient_kernel, runs * channel_blocks,
               partial, interpret, g=g, tile=tile, rows_each=rows_each,
               reduce_each_step=reduce_each_step)(x, dy)
  return sums.sum(axis=0).reshape(*g.kernel, g.channels)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def pallas_depthwise(x, w, strides, padding, interpret=False):
  """Depthwise convolution of x [N, H, W, C] with w [kh, kw, C]: `strides`
  (rows, columns), `padding` ((top, bottom), (left, right)); the result in
  x's dtype, accumulated in float32."""
  return forward(x, w, Geometry.of(x.shape, w.shape[:2], strides, padding),
                 interpret)


def _pallas_forward(x, w, strides, padding, interpret):
  return pallas_depthwise(x, w, strides, padding, interpret), (x, w)


def _pallas_backward(strides, padding, interpret, saved, dy):
  x, w = saved
  g = Geometry.of(x.shape, w.shape[:2], strides, padding)
  return (data_gradient(dy, w, g, x.dtype, interpret),
          filter_gradient(x, dy, g, interpret).astype(w.dtype))


pallas_depthwise.defvjp(_pallas_forward, _pallas_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def pallas_forward_depthwise(x, w, strides, padding, interpret=False):
  """pallas_depthwise's forward kernel, XLA's (cuDNN's) gradients."""
  return pallas_depthwise(x, w, strides, padding, interpret)


def _forward_only(x, w, strides, padding, interpret):
  return pallas_forward_depthwise(x, w, strides, padding, interpret), (x, w)


def _xla_backward(strides, padding, interpret, saved, dy):
  del interpret
  x, w = saved
  _, vjp = jax.vjp(lambda x_, w_: xla_depthwise(x_, w_, strides, padding),
                   x, w)
  return vjp(dy)


pallas_forward_depthwise.defvjp(_forward_only, _xla_backward)
