"""depthwise=pallas's kernels against XLA's convolution, shape by shape, on
this device: how far their results lie apart and how long each takes
(forward; forward and both gradients). On a GPU the kernels run through
Triton, the shapes are B0's at 224 px; elsewhere they run interpreted on
a small batch (numerics only).

  python -m pipeline.probe.depthwise_check OUT.json [rows|tiles]
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from pipeline.probe import depthwise_pallas
from pipeline.probe import depthwise_xla

# B0's depthwise convolutions at 224 px, the largest first: (rows,
# columns, channels, kernel, stride).
B0_SHAPES = ((112, 112, 32, 3, 1), (112, 112, 96, 3, 2),
             (56, 56, 144, 3, 1), (56, 56, 144, 5, 2), (28, 28, 240, 5, 1),
             (14, 14, 672, 5, 2))


def _same(size, kernel, stride):
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _timed_ms(function, *args, repeats=10):
  jax.block_until_ready(function(*args))
  began = time.perf_counter()
  for _ in range(repeats):
    out = function(*args)
  jax.block_until_ready(out)
  return round((time.perf_counter() - began) / repeats * 1e3, 3)


# Tiles tried for the gradients' kernels: the data gradient's (elements,
# widest channels), the filter gradient's (accumulated values, widest
# channels, programs, a tile summed at each step).
DATA_GRADIENT_TILES = ((2048, 64), (1024, 32), (4096, 128))
FILTER_GRADIENT_TILES = ((8192, 32, 512, False), (8192, 64, 1056, False),
                         (4096, 64, 528, True), (8192, 128, 1056, True),
                         (16384, 64, 264, False))


def _inputs(batch, shape, dtype):
  rows, columns, channels, kernel, stride = shape
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(batch, rows, columns, channels)), dtype)
  w = jnp.asarray(rng.normal(size=(kernel, kernel, channels)) / kernel, dtype)
  padding = (_same(rows, kernel, stride), _same(columns, kernel, stride))
  return x, w, (stride, stride), padding


def check(batch, shape, dtype, interpret, repeats):
  """One shape's errors (largest difference over the largest value, per
  output) and times, the kernels against XLA."""
  x, w, strides, padding = _inputs(batch, shape, dtype)
  forms = {
      'kernels': lambda x, w: depthwise_pallas.pallas_depthwise(
          x, w, strides, padding, interpret),
      'xla': lambda x, w: depthwise_xla.xla_depthwise(
          x, w, strides, padding)}
  results, times = {}, {}
  for name, form in forms.items():
    forward = jax.jit(form)

    def both(x, w, form=form):
      y, vjp = jax.vjp(form, x, w)
      return (y, *vjp(y))

    both = jax.jit(both)
    results[name] = [np.asarray(a, np.float32) for a in both(x, w)]
    times[name] = {'forward_ms': _timed_ms(forward, x, w, repeats=repeats),
                   'forward_and_gradients_ms': _timed_ms(both, x, w,
                                                         repeats=repeats)}
  errors = {
      out: float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-9))
      for out, a, b in zip(('y', 'dx', 'dw'), results['kernels'],
                           results['xla'])}
  return {'shape': list(shape), 'dtype': jnp.dtype(dtype).name,
          'relative_error': errors, **times}


def gradient_programs(x, w, strides, padding, interpret=False):
  """{name: (jitted function, its arguments)} of each gradient alone:
  XLA's, and the kernels' under each tile tried. Every array is an
  argument: one a program closed over would be lowered into it as a
  constant (jax 0.11.2's default), a copy of up to 617 MB in each of ~24
  compiles."""
  g = depthwise_pallas.Geometry.of(x.shape, w.shape[:2], strides, padding)
  y = depthwise_xla.xla_depthwise(x, w, strides, padding)
  convolve = lambda x_, w_: depthwise_xla.xla_depthwise(x_, w_, strides,
                                                        padding)
  programs = {
      'xla_data_gradient': (jax.jit(lambda dy, x_, w_: jax.vjp(
          lambda a: convolve(a, w_), x_)[1](dy)), (y, x, w)),
      'xla_filter_gradient': (jax.jit(lambda dy, x_, w_: jax.vjp(
          lambda b: convolve(x_, b), w_)[1](dy)), (y, x, w))}
  for elements, channels in DATA_GRADIENT_TILES:
    programs[f'data_gradient/{elements}/{channels}'] = (jax.jit(
        lambda dy, w_, e=elements, c=channels: depthwise_pallas.data_gradient(
            dy, w_, g, x.dtype, interpret, e, c)), (y, w))
  for accumulated, channels, count, reduce_each in FILTER_GRADIENT_TILES:
    programs[f'filter_gradient/{accumulated}/{channels}/{count}/'
             f'{int(reduce_each)}'] = (jax.jit(
                 lambda x_, dy, a=accumulated, c=channels, n=count,
                 r=reduce_each: depthwise_pallas.filter_gradient(
                     x_, dy, g, interpret, a, c, n, r)), (x, y))
  return programs


def tiles(batch, shape, dtype, repeats):
  """Each gradient alone, XLA's and the kernels' under each tile tried:
  milliseconds a call."""
  x, w, strides, padding = _inputs(batch, shape, dtype)
  row = {'shape': list(shape), 'dtype': jnp.dtype(dtype).name,
         'data_gradient_ms': {}, 'filter_gradient_ms': {}}
  for name, (program, args) in gradient_programs(x, w, strides,
                                                 padding).items():
    ms = _timed_ms(program, *args, repeats=repeats)
    if name.startswith('xla_'):
      row[f'{name}_ms'] = ms
    else:
      kind, tile = name.split('/', 1)
      row[f'{kind}_ms'][tile] = ms
  return row


def main(path, sections=('rows', 'tiles')):
  on_gpu = depthwise_pallas.pallas_route() == 'triton'
  batch, shapes, repeats = ((256, B0_SHAPES, 10) if on_gpu else
                            (1, ((12, 12, 32, 3, 1), (12, 12, 24, 5, 2)), 1))
  figures = {'device': jax.devices()[0].device_kind, 'batch': batch,
             'rows': [], 'tiles': []}

  def record(section, measure, *args):
    try:
      figures[section].append(measure(*args))
    except Exception as e:  # pylint: disable=broad-except
      figures[section].append({'args': str(args[1:3]),
                               'failed': f'{type(e).__name__}: {str(e)[:600]}'})
    print(json.dumps(figures[section][-1]), flush=True)
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(figures, f, indent=2)

  if 'rows' in sections:
    for shape in shapes:
      record('rows', check, batch, shape, jnp.bfloat16, not on_gpu, repeats)
    record('rows', check, batch, shapes[0], jnp.float32, not on_gpu, repeats)
  if on_gpu and 'tiles' in sections:  # The gradients' tiles.
    for shape in (shapes[2], shapes[4], shapes[0], shapes[1]):
      record('tiles', tiles, batch, shape, jnp.bfloat16, repeats)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2:] or ('rows', 'tiles'))
