"""The one-pass batch norm and squeeze-excite's matrix products against
Keras' own layers, on whichever Keras backend runs the tests (the fast
suite: TensorFlow; CI's JAX tier: JAX), and checkpoints across the forms.
"""

import os

import keras
import numpy as np
import pytest
from keras import ops

from pipeline.recipe import layers
from pipeline.recipe import models

CHANNELS = 6


def _gradients(function, arguments):
  """(what `function` returns beside its value, d value / d argument for
  each) on this Keras backend; `function` returns (value, aux)."""
  if keras.backend.backend() == 'jax':
    import jax  # pylint: disable=g-import-not-at-top
    (_, aux), grads = jax.value_and_grad(function, argnums=tuple(
        range(len(arguments))), has_aux=True)(*arguments)
    return aux, grads
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  arguments = [tf.convert_to_tensor(a) for a in arguments]
  with tf.GradientTape() as tape:
    tape.watch(arguments)
    value, aux = function(*arguments)
  return aux, tape.gradient(value, arguments)


def _trained_once(layer_class, policy, x, upstream, moving_mean):
  """One training call of a fresh layer of `layer_class` under `policy` on
  `x`: (outputs, d<outputs, upstream>/d(x, gamma, beta), moving mean,
  moving variance), all as float32 numpy."""
  layer = layer_class(momentum=0.9, dtype=policy)
  layer.build(x.shape)
  rng = np.random.default_rng(1)
  layer.gamma.assign(rng.uniform(0.5, 1.5, CHANNELS).astype('float32'))
  layer.beta.assign(rng.normal(size=CHANNELS).astype('float32'))
  layer.moving_mean.assign(moving_mean)
  trainable = [v.value for v in layer.trainable_variables]
  non_trainable = [v.value for v in layer.non_trainable_variables]

  def objective(inputs, gamma, beta):
    outputs, updated = layer.stateless_call(
        [gamma, beta], non_trainable, inputs, training=True)
    return (ops.sum(ops.cast(outputs, 'float32') * upstream),
            (outputs, updated))

  (outputs, (mean, variance)), grads = _gradients(
      objective, [ops.cast(x, layer.compute_dtype), *trainable])
  as_numpy = lambda t: np.asarray(ops.convert_to_numpy(
      ops.cast(t, 'float32')))
  return (as_numpy(outputs), [as_numpy(g) for g in grads], as_numpy(mean),
          as_numpy(variance))


def _exact(x, upstream, moving_mean, epsilon=1e-3, momentum=0.9):
  """Batch norm's outputs, gradients and moving statistics in float64."""
  rng = np.random.default_rng(1)
  gamma = rng.uniform(0.5, 1.5, CHANNELS).astype('float32').astype('float64')
  beta = rng.normal(size=CHANNELS).astype('float32').astype('float64')
  x, dy = x.astype('float64'), upstream.astype('float64')
  axes, count = (0, 1, 2), x.size / CHANNELS
  mean, variance = x.mean(axes), x.var(axes)
  inverse = 1 / np.sqrt(variance + epsilon)
  normalized = (x - mean) * inverse
  dbeta, dgamma = dy.sum(axes), (dy * normalized).sum(axes)
  dx = gamma * inverse * (dy - (dbeta + normalized * dgamma) / count)
  return (normalized * gamma + beta, [dx, dgamma, dbeta],
          momentum * moving_mean + (1 - momentum) * mean,
          momentum + (1 - momentum) * variance)


def _error(ours, exact):
  """The largest difference, relative to the figures' scale (at least 1)."""
  return np.abs(ours - exact).max() / max(float(np.abs(exact).max()), 1.0)


def test_one_pass_batch_norm_is_exact_where_keras_is_on_inputs_far_from_zero():
  """float32, activations of mean 300 and spread 2, the moving mean where a
  run's has got to (near the batch's): outputs, the gradients of input,
  gamma and beta, and both moving statistics are within float32 rounding
  of the exact (float64) figures, as near as Keras' layer's or nearer."""
  rng = np.random.default_rng(0)
  x = (300 + 2 * rng.normal(size=(8, 5, 5, CHANNELS))).astype('float32')
  upstream = rng.normal(size=x.shape).astype('float32')
  moving_mean = np.full(CHANNELS, 299.0, 'float32')
  exact = _exact(x, upstream, moving_mean)
  ours = _trained_once(layers.OnePassBatchNormalization, 'float32', x,
                       upstream, moving_mean)
  theirs = _trained_once(keras.layers.BatchNormalization, 'float32', x,
                         upstream, moving_mean)
  pairs = [(ours[0], theirs[0], exact[0]),
           *zip(ours[1], theirs[1], exact[1]),
           (ours[2], theirs[2], exact[2]), (ours[3], theirs[3], exact[3])]
  for mine, keras_s, truth in pairs:
    assert _error(mine, truth) < 5e-5
    assert _error(mine, truth) <= max(_error(keras_s, truth), 1e-5)


@pytest.mark.parametrize('spread', [1.0, 0.1])
def test_one_pass_batch_norm_is_exact_at_the_first_step(spread):
  """A fresh layer (moving mean 0, as at a run's first step, or on a
  user's unnormalised inputs), float32, inputs of mean 300: outputs, the
  gradients and the batch's statistics within 1e-3 of the exact (float64)
  figures (of their scale), and as near as Keras' layer or nearer (on
  TensorFlow Keras' own is 1.4e-3 off at a spread of 0.1). Shifted by a
  moving mean of 0 the sums were the unshifted one-pass form's: 7e-3 off
  at a spread of 1, 200% at 0.1."""
  rng = np.random.default_rng(0)
  x = (300 + spread * rng.normal(size=(64, 16, 16, CHANNELS))).astype(
      'float32')
  upstream = rng.normal(size=x.shape).astype('float32')
  fresh = np.zeros(CHANNELS, 'float32')
  exact = _exact(x, upstream, fresh)
  ours = _trained_once(layers.OnePassBatchNormalization, 'float32', x,
                       upstream, fresh)
  theirs = _trained_once(keras.layers.BatchNormalization, 'float32', x,
                         upstream, fresh)
  for mine, keras_s, truth in [(ours[0], theirs[0], exact[0]),
                               *zip(ours[1], theirs[1], exact[1])]:
    assert _error(mine, truth) < 1e-3
    assert _error(mine, truth) <= max(_error(keras_s, truth), 1e-5)
  np.testing.assert_allclose(ours[2], exact[2], rtol=1e-5)
  np.testing.assert_allclose(_batch_variance(ours[3]),
                             _batch_variance(exact[3]), rtol=1e-3)


def _batch_mean(moving_mean, start=299.0, momentum=0.9):
  """The batch mean a moving mean that was `start` took in."""
  return (moving_mean - momentum * start) / (1 - momentum)


def _batch_variance(moving_variance, momentum=0.9):
  """The batch variance a fresh moving variance (1) took in."""
  return (moving_variance - momentum) / (1 - momentum)


@pytest.mark.parametrize('policy', ['mixed_bfloat16', 'mixed_float16'])
def test_one_pass_batch_norm_matches_keras_in_16_bits(policy):
  """16-bit activations (bfloat16: 8 bits of mantissa; float16: 11), the
  upstream gradient scaled as float16's loss scale does (2^15 over the
  count, so its values are large but finite): outputs and gradients within
  16-bit rounding of Keras' layer's, and the moving statistics as Keras
  updates them, to within a hundredth of the batch's deviation: a moving
  mean left unchanged (off by the batch's 1) or momentum swapped (by 8)
  fails."""
  rng = np.random.default_rng(0)
  x = (300 + 2 * rng.normal(size=(8, 5, 5, CHANNELS))).astype('float32')
  loss_scale = 2.0 ** 15 / x.size
  upstream = (loss_scale * rng.normal(size=x.shape)).astype('float32')
  moving_mean = np.full(CHANNELS, 299.0, 'float32')
  ours = _trained_once(layers.OnePassBatchNormalization, policy, x, upstream,
                       moving_mean)
  theirs = _trained_once(keras.layers.BatchNormalization, policy, x,
                         upstream, moving_mean)
  rounding = 2.0 ** -8 if policy == 'mixed_bfloat16' else 2.0 ** -11
  for mine, keras_s in [(ours[0], theirs[0]), *zip(ours[1], theirs[1])]:
    assert np.isfinite(mine).all()
    scale = np.abs(keras_s).max()
    assert np.abs(mine - keras_s).max() <= 4 * rounding * scale
  np.testing.assert_allclose(_batch_mean(ours[2]), _batch_mean(theirs[2]),
                             atol=0.02)
  np.testing.assert_allclose(_batch_variance(ours[3]),
                             _batch_variance(theirs[3]), rtol=0.01)


def test_the_shift_is_what_keeps_one_pass_statistics_exact():
  """Unshifted, one pass loses the variance of such activations to
  cancellation in float32 (E[x^2] - E[x]^2 of two numbers near 90,000);
  shifted by a value of the batch, it keeps it, whatever the moving mean
  (here a fresh layer's 0)."""
  rng = np.random.default_rng(0)
  x = (300 + 2 * rng.normal(size=(64, 16, 16, CHANNELS))).astype('float32')
  exact = x.astype('float64').var(axis=(0, 1, 2))
  naive = ((x * x).mean(axis=(0, 1, 2), dtype='float32') -
           x.mean(axis=(0, 1, 2), dtype='float32') ** 2)
  assert np.abs(naive - exact).max() > 0.05 * exact.max()
  _, _, _, ours = _trained_once(
      layers.OnePassBatchNormalization, 'float32', x,
      np.zeros_like(x), np.zeros(CHANNELS, 'float32'))
  np.testing.assert_allclose(_batch_variance(ours), exact, rtol=1e-3)


def test_a_frozen_or_inferring_layer_is_keras_own():
  """Inference and a frozen layer take Keras' code: the moving statistics."""
  layer = layers.OnePassBatchNormalization()
  x = np.full((2, 3, 3, CHANNELS), 5.0, 'float32')
  layer.build(x.shape)
  np.testing.assert_allclose(ops.convert_to_numpy(layer(x, training=False)),
                             5.0 / np.sqrt(1.0 + layer.epsilon), rtol=1e-6)
  layer.trainable = False
  np.testing.assert_allclose(ops.convert_to_numpy(layer(x, training=True)),
                             5.0 / np.sqrt(1.0 + layer.epsilon), rtol=1e-6)


def test_squeeze_excite_as_a_matrix_product_equals_the_convolution():
  conv = keras.layers.Conv2D(4, 1, activation='sigmoid')
  x = np.random.default_rng(0).normal(size=(3, 1, 1, 8)).astype('float32')
  conv.build(x.shape)
  product = layers.Conv1x1AsMatmul.from_config(conv.get_config())
  product.build(x.shape)
  product.set_weights(conv.get_weights())
  np.testing.assert_allclose(ops.convert_to_numpy(product(x)),
                             ops.convert_to_numpy(conv(x)), rtol=1e-5,
                             atol=1e-6)


def _inferred(model, images):
  if keras.backend.backend() == 'jax':
    # Compiled whole: op by op, JAX compiles each slice of each tap apart.
    return model.predict(images, verbose=0)
  return np.asarray(ops.convert_to_numpy(model(images, training=False)))


def test_the_swap_keeps_names_weights_and_every_checkpoint(tmp_path):
  """B0's code at a fraction of its size: every batch norm, every 1x1
  convolution on a 1x1 map and every depthwise convolution is replaced,
  names kept; weights saved from either form load into the other and infer
  the same."""
  keras.utils.set_random_seed(0)
  ours = models.build_model('efficientnet_tiny', 5, 32)  # Keras' forms.
  swapped = models.build_model('efficientnet_tiny', 5, 32, forms=dict(
      batch_norm='one_pass', squeeze_excite='matmul',
      depthwise='conv_in_float32'))
  built = [type(layer) for layer in models.backbone(swapped).layers]
  assert keras.layers.BatchNormalization not in built
  assert keras.layers.DepthwiseConv2D not in built
  # The stem's, the head's, and the blocks' (the first block has no
  # expansion: 2 + 3 x 3).
  assert built.count(layers.OnePassBatchNormalization) == 13
  # 4 blocks' squeeze and excite (8); at 32 px the other 1x1 convolutions
  # (expansions, projections, the head's) see maps of 16 to 2 pixels a side
  # and stay convolutions.
  assert built.count(layers.Conv1x1AsMatmul) == 8
  assert built.count(layers.Float32DepthwiseConv2D) == 4
  assert ([(w.name, w.shape) for w in ours.weights] ==
          [(w.name, w.shape) for w in swapped.weights])
  images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3),
                                             dtype='uint8')
  saved = os.path.join(tmp_path, 'swapped.weights.h5')
  swapped.save_weights(saved)
  ours.load_weights(saved)
  np.testing.assert_allclose(_inferred(ours, images),
                             _inferred(swapped, images), rtol=1e-4, atol=1e-5)
  # And back: Keras' form trained a little, read by the swapped one.
  ours.layers[-1].bias.assign(np.arange(5, dtype='float32'))
  ours.save_weights(saved)
  swapped.load_weights(saved)
  np.testing.assert_allclose(_inferred(swapped, images),
                             _inferred(ours, images), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != 'tensorflow',
                    reason="TensorFlow's checkpoint format: the TF route's")
def test_a_tensorflow_checkpoint_reads_across_the_forms(tmp_path):
  """The TensorFlow route's checkpoints (an object graph of the model's
  layers and their variables) read into the other form unchanged."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  ours = models.build_model('efficientnet_tiny', 5, 32)
  swapped = models.build_model('efficientnet_tiny', 5, 32, forms=dict(
      batch_norm='one_pass', squeeze_excite='matmul',
      depthwise='conv_in_float32'))
  for variable in ours.weights:
    variable.assign(variable + 0.01)
  path = tf.train.Checkpoint(model=ours).write(str(tmp_path / 'ckpt'))
  tf.train.Checkpoint(model=swapped).read(path).assert_consumed()
  images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3),
                                             dtype='uint8')
  np.testing.assert_allclose(_inferred(swapped, images),
                             _inferred(ours, images), rtol=1e-4, atol=1e-5)
