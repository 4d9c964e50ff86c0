"""The probe's depthwise experiments (pipeline/probe/depthwise_forms.py) on
this CPU: depthwise=pallas's kernels interpreted, forward and both
gradients within the dtype's rounding of XLA's convolution for every
depthwise shape of B0 and EfficientNetV2-S, and lowered through Triton for
an H200 (what a GPU compiles, short of running it); the shifted form's
outputs and gradients; each form in a network, Keras' variables kept, and
none of them a form of launch.train. JAX only: CI runs it in the probe's
environment, as a lent GPU machine has it."""

import math
import os
import re

import numpy as np
import pytest

jax = pytest.importorskip('jax', reason='needs JAX (the probe\'s environment)')
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

from pipeline.probe import depthwise_pallas  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import depthwise_xla  # pylint: disable=g-import-not-at-top,wrong-import-position

# Every depthwise convolution of keras.applications' EfficientNetB0 at 224
# px and EfficientNetV2S at 300 (its last training stage) and 384 px (its
# evaluation), read off the built models: (rows, columns, channels, kernel,
# stride, padding). B0's stride-2 layers pad first, then run 'valid' on odd
# sizes; V2-S's run 'same', 19 px ones included.
B0 = ((112, 112, 32, 3, 1, 'same'), (113, 113, 96, 3, 2, 'valid'),
      (56, 56, 144, 3, 1, 'same'), (59, 59, 144, 5, 2, 'valid'),
      (28, 28, 240, 5, 1, 'same'), (29, 29, 240, 3, 2, 'valid'),
      (14, 14, 480, 3, 1, 'same'), (14, 14, 480, 5, 1, 'same'),
      (14, 14, 672, 5, 1, 'same'), (17, 17, 672, 5, 2, 'valid'),
      (7, 7, 1152, 5, 1, 'same'), (7, 7, 1152, 3, 1, 'same'))
V2S = ((48, 48, 256, 3, 2, 'same'), (24, 24, 512, 3, 1, 'same'),
       (24, 24, 768, 3, 1, 'same'), (24, 24, 960, 3, 1, 'same'),
       (24, 24, 960, 3, 2, 'same'), (12, 12, 1536, 3, 1, 'same'),
       (38, 38, 256, 3, 2, 'same'), (19, 19, 512, 3, 1, 'same'),
       (19, 19, 768, 3, 1, 'same'), (19, 19, 960, 3, 1, 'same'),
       (19, 19, 960, 3, 2, 'same'), (10, 10, 1536, 3, 1, 'same'))
# Odd widths, channel counts that are no power of two, a kernel wider than
# a tile's edge.
ODD = ((9, 7, 5, 3, 1, 'same'), (11, 13, 70, 5, 2, 'same'),
       (6, 5, 3, 5, 1, 'valid'))
# One rounding of the dtype: the kernels and XLA both sum in float32 and
# round once, so a sum that differs in its last float32 bits may round to
# the neighbouring 16-bit value.
ROUNDING = {jnp.bfloat16: 2.0 ** -7, jnp.float32: 2.0 ** -20}
# float32 sums in another order: their roundings grow as the square root of
# the terms (a filter gradient sums batch x rows x columns of them).
FLOAT32_EPSILON = 2.0 ** -24


def _padding(shape):
  rows, columns, _, kernel, stride, padding = shape
  if padding == 'valid':
    return ((0, 0), (0, 0))
  same = lambda size: (max((-(-size // stride) - 1) * stride + kernel - size,
                           0))
  return tuple((same(size) // 2, same(size) - same(size) // 2)
               for size in (rows, columns))


def _both_ways(shape, dtype, batch=2):
  """(the kernels', XLA's) [output, input gradient, filter gradient] for
  random inputs of `shape` and an upstream gradient, as float32."""
  rows, columns, channels, kernel, stride, _ = shape
  rng = np.random.default_rng(sum(shape[:5]))
  x = jnp.asarray(rng.normal(size=(batch, rows, columns, channels)), dtype)
  w = jnp.asarray(rng.normal(size=(kernel, kernel, channels)) / kernel,
                  dtype)
  strides, padding = (stride, stride), _padding(shape)
  g = depthwise_pallas.Geometry.of(x.shape, (kernel, kernel), strides,
                                    padding)
  upstream = jnp.asarray(rng.normal(
      size=(batch, g.out_rows, g.out_columns, channels)), dtype)
  results = []
  for form in (lambda x, w: depthwise_pallas.pallas_depthwise(
      x, w, strides, padding, True),
               lambda x, w: depthwise_xla.xla_depthwise(
                   x, w, strides, padding)):
    y, vjp = jax.vjp(form, x, w)
    results.append([np.asarray(a, np.float32) for a in (y, *vjp(upstream))])
  return results


def _assert_within_rounding(ours, xla, dtype):
  """Each of output, input gradient and filter gradient within the dtype's
  rounding of XLA's, relative to the largest value (and, summed over more
  terms than a 16-bit rounding hides, within float32's sum of roundings)."""
  # A filter gradient's terms: one an output position.
  summed = ours[0].size // ours[0].shape[-1]
  for name, mine, theirs in zip(('output', 'input gradient',
                                 'filter gradient'), ours, xla):
    assert mine.shape == theirs.shape, name
    scale = np.abs(theirs).max()
    error = np.abs(mine - theirs).max()
    tolerance = ROUNDING[dtype]
    if name == 'filter gradient':
      tolerance = max(tolerance, 8 * FLOAT32_EPSILON * np.sqrt(summed))
    assert error <= tolerance * scale, (
        f'{name}: {error} off, {error / scale:.2e} of its largest value')


@pytest.mark.parametrize('shape', B0 + V2S + ODD, ids=str)
def test_the_kernels_match_xla_in_bfloat16_on_every_shape(shape):
  ours, xla = _both_ways(shape, jnp.bfloat16)
  _assert_within_rounding(ours, xla, jnp.bfloat16)


@pytest.mark.parametrize('shape', B0[:6] + ODD, ids=str)
def test_the_kernels_match_xla_in_float32(shape):
  ours, xla = _both_ways(shape, jnp.float32)
  _assert_within_rounding(ours, xla, jnp.float32)


def test_the_check_finds_a_wrong_tap():
  """A kernel whose taps were read one column off would pass nothing: the
  comparison catches it (the filter transposed stands in for it)."""
  shape = ODD[0]
  ours, xla = _both_ways(shape, jnp.float32)
  rows, columns, channels, kernel, stride, _ = shape
  rng = np.random.default_rng(sum(shape[:5]))
  x = jnp.asarray(rng.normal(size=(2, rows, columns, channels)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(kernel, kernel, channels)) / kernel,
                  jnp.float32)
  wrong = np.asarray(depthwise_pallas.pallas_depthwise(
      x, jnp.transpose(w, (1, 0, 2)), (stride, stride), _padding(shape),
      True))
  with pytest.raises(AssertionError):
    _assert_within_rounding([wrong, *ours[1:]], xla, jnp.float32)


def _lowered_for_an_h200(function, *shapes):
  """The StableHLO `function` lowers to for a CUDA H200 (an abstract
  device: Pallas' Triton lowering needs to know the GPU, not to have it)."""
  from jax._src import mesh as mesh_lib  # pylint: disable=g-import-not-at-top  # AbstractDevice has no public constructor.
  device = mesh_lib.AbstractDevice(device_kind='NVIDIA H200', num_cores=132,
                                   platform='gpu')
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(
      (1,), ('x',), abstract_device=device)):
    return jax.export.export(
        jax.jit(function), platforms=['cuda'],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(
            '__gpu$xla.gpu.triton')])(*shapes).mlir_module()


@pytest.mark.parametrize('dtype, shapes', [(jnp.bfloat16, B0 + V2S + ODD),
                                           (jnp.float32, ODD)])
def test_every_kernel_lowers_through_triton_for_an_h200(dtype, shapes):
  """Each shape's forward, data gradient and filter gradient become
  Triton kernels (a tile that is not a power of two, an index Triton's
  lowering refuses, fails here)."""
  for shape in shapes:
    rows, columns, channels, kernel, stride, _ = shape

    def step(x, w, stride=stride, shape=shape):
      y, vjp = jax.vjp(lambda x, w: depthwise_pallas.pallas_depthwise(
          x, w, (stride, stride), _padding(shape)), x, w)
      return vjp(y)

    module = _lowered_for_an_h200(
        step, jax.ShapeDtypeStruct((256, rows, columns, channels), dtype),
        jax.ShapeDtypeStruct((kernel, kernel, channels), dtype))
    assert module.count('__gpu$xla.gpu.triton') == 3, shape


def test_the_forms_keep_keras_variables_and_read_each_others_weights(
    tmp_path, monkeypatch):
  """The tiny network with each JAX form computes what Keras' own
  convolution does (the kernels interpreted on this CPU), under Keras'
  names: a weights file written by one form loads into the others."""
  import keras  # pylint: disable=g-import-not-at-top
  from pipeline.probe import depthwise_forms  # pylint: disable=g-import-not-at-top
  from pipeline.recipe import layers  # pylint: disable=g-import-not-at-top
  from pipeline.recipe import models  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(depthwise_pallas.INTERPRET_VARIABLE, '1')
  depthwise_forms.register()
  keras.utils.set_random_seed(0)
  built = {form: models.build_model('efficientnet_tiny', 5, 32, forms={
      'batch_norm': 'keras', 'squeeze_excite': 'conv', 'depthwise': form})
           for form in ('conv', 'pallas', 'pallas_forward', 'stacked_grad',
                        'shifted')}
  images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3),
                                             dtype='uint8')
  saved = str(tmp_path / 'conv.weights.h5')
  built['conv'].save_weights(saved)
  expected = built['conv'].predict(images, verbose=0)
  for form, model in built.items():
    classes = {type(layer) for layer in models.backbone(model).layers}
    assert layers.DEPTHWISES[form].layer in classes
    assert ([(w.name, w.shape) for w in model.weights] ==
            [(w.name, w.shape) for w in built['conv'].weights])
    model.load_weights(saved)
    np.testing.assert_allclose(model.predict(images, verbose=0), expected,
                               rtol=1e-4, atol=1e-5)


def test_the_experiments_are_no_forms_of_a_run():
  """A GPU measured each slower than Keras' convolution in the step: they
  are forms in the probe's process alone (launch.probe registers them)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  listed = subprocess.run(
      [sys.executable, '-c', 'from pipeline.recipe import layers; '
       'print(",".join(layers.DEPTHWISES.names()))'],
      capture_output=True, text=True, check=True).stdout.strip()
  assert listed == 'conv,conv_in_float32'


@pytest.mark.parametrize('kernel, strides, padding, size', [
    (3, 1, 'same', 9), (5, 1, 'same', 8), (3, 2, 'same', 9),
    (5, 2, 'same', 10), (3, 2, 'valid', 11), (5, 1, 'valid', 9)])
def test_the_shifted_depthwise_convolution_equals_keras(kernel, strides,
                                                       padding, size):
  """Outputs and both gradients (input and kernel) as Keras' convolution
  computes them, for B0's kernels, strides and paddings (its stride-2
  layers pad first, then 'valid'), odd and even sizes."""
  import keras  # pylint: disable=g-import-not-at-top
  from pipeline.probe import depthwise_forms  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(kernel * 10 + strides)
  x = rng.normal(size=(2, size, size, 6)).astype('float32')
  conv = keras.layers.DepthwiseConv2D(kernel, strides, padding,
                                      use_bias=False)
  conv.build(x.shape)
  shifted = depthwise_forms.ShiftedDepthwiseConv2D.from_config(
      conv.get_config())
  shifted.build(x.shape)
  shifted.set_weights(conv.get_weights())
  upstream = rng.normal(size=conv.compute_output_shape(x.shape)).astype(
      'float32')
  results = []
  for layer in (conv, shifted):
    def loss(inputs, kernel_value, layer=layer):
      outputs, _ = layer.stateless_call([kernel_value], [], inputs)
      return jnp.sum(outputs * upstream), outputs
    (_, outputs), grads = jax.value_and_grad(loss, argnums=(0, 1),
                                             has_aux=True)(
                                                 x, conv.get_weights()[0])
    results.append([np.asarray(a) for a in (outputs, *grads)])
  for ours, theirs in zip(results[1], results[0]):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_a_cpu_leaves_the_pallas_form_to_xla_unless_asked(monkeypatch):
  monkeypatch.delenv(depthwise_pallas.INTERPRET_VARIABLE, raising=False)
  assert depthwise_pallas.pallas_route() is None
  monkeypatch.setenv(depthwise_pallas.INTERPRET_VARIABLE, '1')
  assert depthwise_pallas.pallas_route() == 'interpret'
  assert os.environ[depthwise_pallas.INTERPRET_VARIABLE] == '1'


def test_pallas_call_is_given_tritons_parameters(monkeypatch):
  """Named, so every jax the project accepts lowers the kernels through
  Triton (jax 0.9.0-0.11.0 took Mosaic GPU without them)."""
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  given = []
  real = depthwise_pallas.pl.pallas_call

  def recorded(*args, **kwargs):
    given.append(kwargs.get('compiler_params'))
    return real(*args, **kwargs)

  monkeypatch.setattr(depthwise_pallas.pl, 'pallas_call', recorded)
  x = jnp.ones((1, 6, 6, 8), jnp.float32)
  w = jnp.ones((3, 3, 8), jnp.float32)
  y, vjp = jax.vjp(lambda x, w: depthwise_pallas.pallas_depthwise(
      x, w, (1, 1), ((1, 1), (1, 1)), True), x, w)
  vjp(y)
  assert len(given) == 3 and all(
      isinstance(p, plgpu.CompilerParams) and (p.num_warps, p.num_stages) ==
      (4, 3) for p in given), given


def _large_constants(text, elements=1024):
  """The tensor types of constants in lowered StableHLO `text` that hold
  `elements` or more values."""
  found = []
  for shape in re.findall(r'stablehlo\.constant dense[^:]*: tensor<([\dx]+)x',
                          text):
    if math.prod(int(n) for n in shape.split('x')) >= elements:
      found.append(shape)
  return found


def test_the_kernel_checks_pass_their_arrays_as_arguments():
  """The probe's gradient programs lower with no large constant: a closed-
  over input would be a copy of it in every compile (up to 617 MB)."""
  from pipeline.probe import depthwise_check  # pylint: disable=g-import-not-at-top
  x, w, strides, padding = depthwise_check._inputs(  # pylint: disable=protected-access
      2, (16, 16, 32, 3, 1), jnp.float32)
  programs = depthwise_check.gradient_programs(x, w, strides, padding,
                                               interpret=True)
  assert len(programs) == 2 + len(depthwise_check.DATA_GRADIENT_TILES) + len(
      depthwise_check.FILTER_GRADIENT_TILES)
  for name, (program, args) in programs.items():
    assert not _large_constants(program.lower(*args).as_text()), name
  # The check finds an input closed over, as the programs had it.
  assert _large_constants(jax.jit(lambda dy: dy + x).lower(x).as_text())
