"""The multi-step loop under a real MirroredStrategy over 2 logical CPUs.

Keras 3.15's own steps_per_execution > 1 loop fails here (BUILD_NOTES.md); these
tests prove the project's loop trains under each policy and counts steps.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipeline.rules.speed import precision
from pipeline.backends.tensorflow import steps
from pipeline.recipe import objective
from conftest import xla_on_cpu

NUM_CLASSES = 4
GLOBAL_BATCH = 8


def _small_model():
  """A small conv net: the loop, not EfficientNet, is under test here."""
  images = keras.Input((8, 8, 3), dtype='uint8')
  x = keras.layers.Rescaling(1 / 255)(images)
  x = keras.layers.Conv2D(8, 3, activation='relu')(x)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  logits = keras.layers.Dense(NUM_CLASSES, dtype='float32')(x)
  return keras.Model(images, logits)


def _dataset(input_context):
  rng = np.random.RandomState(input_context.input_pipeline_id)
  labels = rng.randint(0, NUM_CLASSES, 64).astype(np.int32)
  # Learnable: the class sets the brightness.
  images = (labels[:, None, None, None] * 60 +
            rng.randint(0, 20, (64, 8, 8, 3))).astype(np.uint8)
  batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
  return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(
      batch, drop_remainder=True)


def _sgd_training(strategy, build_model, learning_rate, label_smoothing=0.0,
                  jit_compile=False):
  """A model built under `strategy` with SGD and a step counter, and its
  multi-step train function: (model, optimizer, step, train)."""
  with strategy.scope():
    model = build_model()
    optimizer = keras.optimizers.SGD(learning_rate)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  train = steps.make_train_function(
      model, optimizer, strategy, GLOBAL_BATCH,
      objective.Objective(NUM_CLASSES, label_smoothing), step,
      jit_compile=jit_compile)
  return model, optimizer, step, train


def _dense_model(*hidden):
  """Rescaled, flattened pixels through `hidden` layers to a Dense head."""
  images = keras.Input((8, 8, 3), dtype='uint8')
  x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(images))
  for layer in hidden:
    x = layer(x)
  return keras.Model(images, keras.layers.Dense(NUM_CLASSES)(x))


@pytest.fixture
def mirrored():
  # Collective keys restart with every strategy, so two strategies in one
  # process would share keys for different tensors; TF's own tests give
  # each strategy its own key range this way (mirrored_strategy.py).
  tf.distribute.MirroredStrategy._collective_key_base += 10_000  # pylint: disable=protected-access
  strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
  assert strategy.num_replicas_in_sync == 2
  return strategy


# TensorFlow's TPU build links no XLA CPU backend: XLA cases run elsewhere.
WITH_XLA = pytest.param(True, marks=pytest.mark.skipif(
    not xla_on_cpu(), reason='no XLA CPU backend in this TensorFlow build'))


# With XLA each replica's forward and backward compile, and the sum and the
# update (a loss-scale skip too) run after them (steps.replica_train_step).
@pytest.mark.parametrize('policy, seed', [
    ('float32', 0), ('mixed_bfloat16', 0), ('mixed_float16', 0)])
@pytest.mark.parametrize('xla', [False, WITH_XLA])
def test_mirrored_multi_step_trains_and_counts_steps(mirrored, policy, seed,
                                                     xla):
  keras.mixed_precision.set_global_policy(policy)
  keras.utils.set_random_seed(seed)
  try:
    with mirrored.scope():
      model = _small_model()
      optimizer = precision.wrap_optimizer(keras.optimizers.Adam(0.01), policy)
      optimizer.build(model.trainable_variables)
      step = tf.Variable(0, dtype=tf.int64, trainable=False,
                         aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    train = steps.make_train_function(model, optimizer, mirrored, GLOBAL_BATCH,
                                      objective.Objective(NUM_CLASSES), step,
                                      jit_compile=xla)
    iterator = iter(mirrored.distribute_datasets_from_function(_dataset))
    kernel_before = model.layers[2].kernel.numpy().copy()
    losses = []
    for _ in range(10):
      out = train(iterator, tf.constant(4))
      losses.append(float(out['loss']))
    assert int(step.numpy()) == 40
    applied = int(optimizer.iterations.numpy())
    if precision.needs_loss_scaling(policy):
      # Every step is counted; the first overflows at the initial scale of
      # 2**15 and is skipped. Each skip halves the scale (it doubles only
      # after 2,000 good steps), so the scale tells the skips apart.
      skipped = 40 - applied
      assert 1 <= skipped <= 3
      assert optimizer.dynamic_scale.numpy() == 2.0**15 / 2**skipped
      # A skip on one replica's inf is a skip on both: no NaN reaches them.
      assert all(np.isfinite(v.numpy()).all() for v in model.weights)
    else:
      assert applied == 40
    assert np.all(np.isfinite(losses))
    # Learned (1.18 -> 0.73 under each policy, measured): updates that
    # applied nothing would leave it near 1.
    assert losses[-1] < 0.8 * losses[0], losses
    assert not np.allclose(model.layers[2].kernel.numpy(), kernel_before)
    # Both replicas hold the same weights after the all-reduced updates.
    for variable in (model.layers[2].kernel,  # Trainable: all-reduced grads.
                     model.layers[3].moving_mean,  # Averaged after each call.
                     model.layers[3].moving_variance):
      first, second = mirrored.experimental_local_results(variable.value)
      np.testing.assert_array_equal(first.numpy(), second.numpy())
    assert not np.allclose(model.layers[3].moving_mean.numpy(), 0.0)
  finally:
    keras.mixed_precision.set_global_policy('float32')


class _HostOnly(keras.layers.Layer):
  """The identity through strings: ops XLA has no kernel for."""

  def call(self, x):
    return tf.strings.to_number(tf.strings.as_string(x))


@pytest.mark.parametrize('xla', [False, WITH_XLA])
def test_xla_really_compiles_each_replicas_step(mirrored, xla):
  """A model with a host-only op trains without XLA and fails with it: the
  replica's forward and backward do go through XLA under Mirrored."""
  _, optimizer, _, train = _sgd_training(
      mirrored, lambda: _dense_model(_HostOnly()), 0.1, jit_compile=xla)
  iterator = iter(mirrored.distribute_datasets_from_function(_dataset))
  if not xla:
    train(iterator, tf.constant(2))
    assert int(optimizer.iterations.numpy()) == 2
    return
  with pytest.raises(Exception, match='(?i)xla|compil'):
    train(iterator, tf.constant(2))


def test_last_execution_may_run_fewer_steps(mirrored):
  _, optimizer, step, train = _sgd_training(mirrored, _small_model, 0.01,
                                            label_smoothing=0.1)
  iterator = iter(mirrored.distribute_datasets_from_function(_dataset))
  train(iterator, tf.constant(4))
  out = train(iterator, tf.constant(3))  # Same trace, fewer steps.
  assert int(step.numpy()) == 7 == int(optimizer.iterations.numpy())
  assert len(out['step_losses']) == 3  # One loss per step of this call.
  assert float(out['loss']) == pytest.approx(np.mean(out['step_losses']))


def test_the_input_wait_is_the_time_the_steps_waited_for_batches(mirrored):
  """An input that takes 0.2 s a batch (no prefetch): each step waits
  for its batch at least that long, and the waits are no longer than the
  call itself."""
  import time  # pylint: disable=g-import-not-at-top
  _, _, _, train = _sgd_training(mirrored, _small_model, 0.01)

  def slow(input_context):
    def late(images, labels):
      waited = tf.numpy_function(lambda: time.sleep(0.2) or 0.0, [],
                                 tf.float64)
      with tf.control_dependencies([waited]):
        return tf.identity(images), tf.identity(labels)
    return _dataset(input_context).map(late)

  iterator = iter(mirrored.distribute_datasets_from_function(slow))
  train(iterator, tf.constant(1))  # Traces.
  began = time.perf_counter()
  out = train(iterator, tf.constant(3))
  took = time.perf_counter() - began
  assert 3 * 0.2 * 0.9 <= float(out['input_wait_s']) <= took


def test_eval_counts_each_example_once_with_padding(mirrored):
  with mirrored.scope():
    model = _small_model()
  evaluate = steps.make_eval_function(model, mirrored, NUM_CLASSES)

  def dataset(input_context):
    # 5 real examples padded to 8 (2 steps of 4) with weight 0.
    weights = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    images = np.zeros((8, 8, 8, 3), np.uint8)
    labels = np.zeros(8, np.int32)
    ds = tf.data.Dataset.from_tensor_slices((images, labels, weights))
    ds = ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)
    return ds.batch(input_context.get_per_replica_batch_size(4),
                    drop_remainder=True)

  result = evaluate(iter(mirrored.distribute_datasets_from_function(dataset)),
                    tf.constant(2))
  assert float(result['examples']) == 5.0
  # Every real example is of class 0: one row of the confusion matrix.
  confusion = result['confusion'].numpy()
  assert confusion.shape == (NUM_CLASSES, NUM_CLASSES)
  assert confusion.sum() == 5.0 and confusion[0].sum() == 5.0
  assert float(result['accuracy']) == pytest.approx(confusion[0, 0] / 5)


def _logits_are_the_images(images, training):
  # A module-level function, not a lambda: autograph caches conversions by
  # code object, and a collected lambda's slot was seen reused by another.
  del training
  return images


def test_eval_counts_top_five_hits(mirrored):
  """Logits chosen so the true class ranks 1st, 5th and 6th of 7 (and a
  padded example that would be a hit): accuracy 1/3, top-5 2/3."""
  ranks = np.array([[6, 5, 4, 3, 2, 1, 0],   # label 0: 1st.
                    [6, 5, 4, 3, 2, 1, 0],   # label 4: 5th.
                    [6, 5, 4, 3, 2, 1, 0],   # label 5: 6th.
                    [6, 5, 4, 3, 2, 1, 0]],  # padding (label 0, weight 0).
                   np.float32)
  labels = np.array([0, 4, 5, 0], np.int32)
  weights = np.array([1, 1, 1, 0], np.float32)
  with mirrored.scope():
    evaluate = steps.make_eval_function(_logits_are_the_images, mirrored, 7)

  def dataset(input_context):
    ds = tf.data.Dataset.from_tensor_slices((ranks, labels, weights))
    ds = ds.shard(input_context.num_input_pipelines,
                  input_context.input_pipeline_id)
    return ds.batch(2, drop_remainder=True)

  result = evaluate(iter(mirrored.distribute_datasets_from_function(dataset)),
                    tf.constant(1))
  assert float(result['examples']) == 3.0
  assert float(result['accuracy']) == pytest.approx(1 / 3)
  assert float(result['top5_accuracy']) == pytest.approx(2 / 3)


@pytest.mark.parametrize('xla', [False, WITH_XLA])
def test_gradients_are_summed_once_across_replicas(mirrored, xla):
  """One SGD step over 2 replicas moves the weights as one over the batch
  (without XLA), whether or not XLA compiles each replica's gradients.

  The replica step sums gradients itself and the optimizer must not sum them
  again (that would double the step). No batch norm: its per-replica batch
  statistics would make the two forward passes differ.
  """
  images = np.arange(GLOBAL_BATCH * 8 * 8 * 3).reshape(
      (GLOBAL_BATCH, 8, 8, 3)).astype(np.uint8)
  labels = np.arange(GLOBAL_BATCH).astype(np.int32) % NUM_CLASSES

  def one_step(strategy, jit_compile=False):
    keras.utils.set_random_seed(1)
    model, _, _, train = _sgd_training(strategy, _dense_model, 0.5,
                                       jit_compile=jit_compile)

    def dataset(input_context):
      return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
          input_context.get_per_replica_batch_size(GLOBAL_BATCH))

    before = model.layers[-1].kernel.numpy().copy()
    train(iter(strategy.distribute_datasets_from_function(dataset)),
          tf.constant(1))
    return model.layers[-1].kernel.numpy() - before

  single = one_step(tf.distribute.get_strategy())
  assert np.abs(single).max() > 1e-3  # The step moved the weights.
  np.testing.assert_allclose(one_step(mirrored, xla), single, rtol=1e-4,
                             atol=1e-6)


def test_float16_divergence_is_seen_through_the_loss_scale(tmp_path):
  """Under float16 a non-finite loss alone is no divergence: the loss scale
  skips the step. Executions whose every step is skipped, or a loss scale
  below 1, are: a real LossScaleOptimizer on poisoned (NaN) weights."""
  import math  # pylint: disable=g-import-not-at-top
  from pipeline.training import actions  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  from pipeline.backends.tensorflow import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from pipeline.storage.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top
  from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top
  keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    model = _small_model()
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1),
                                         'mixed_float16')
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    train_fn = steps.make_train_function(
        model, optimizer, tf.distribute.get_strategy(), GLOBAL_BATCH,
        objective.Objective(NUM_CLASSES), step, jit_compile=False)
    trainer = trainer_lib.Trainer(model, optimizer, step, train_fn, None,
                                  NUM_CLASSES, 0, 'out of memory')
    checkpointer = Checkpointer(
        workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging')), 2,
        True, files=trainer.checkpoint_files)
    iterator = iter(_dataset(tf.distribute.InputContext()))
    trainer.train(iterator, 2)
    checkpointer.save(2)
    healthy = [w.numpy() for w in model.weights]
    saved_skips, saved_scale = trainer.skipped_steps, trainer.loss_scale
    recover = actions.RecoverFromDivergence(trainer, checkpointer,
                                            max_trials=1, max_skipped=3)

    def execution():
      first = int(step.numpy())
      out = trainer.train(iterator, 2)
      recover(actions.Execution(first, first + 2, 100, 0.1, out))

    for weight in model.trainable_variables:
      weight.assign(tf.fill(weight.shape, math.nan))
    execution()  # Every step skipped, twice in a row: not yet diverged.
    execution()
    assert trainer.skipped_steps == saved_skips + 4
    assert trainer.loss_scale == saved_scale / 16
    with pytest.raises(actions.RolledBack) as rolled:
      execution()  # The third in a row: rolled back to step 2.
    assert rolled.value.step == 2 and int(step.numpy()) == 2
    assert trainer.skipped_steps == saved_skips
    assert trainer.loss_scale == saved_scale
    for weight, value in zip(model.weights, healthy):
      np.testing.assert_array_equal(weight.numpy(), value)
    optimizer.dynamic_scale.assign(0.5)
    with pytest.raises(UserError, match=r'diverged at step 4 \(loss scale 0.5 '
                       r'fell below 1\) after 1 recoveries'):
      execution()
  finally:
    keras.mixed_precision.set_global_policy('float32')


@pytest.mark.parametrize('loss_scaled', [False, True])
def test_the_gradient_norm_is_the_whole_batchs_unscaled_and_unclipped(
    mirrored, loss_scaled):
  """Over 2 replicas the step reports the global norm of the whole batch's
  gradient (the replicas' sum), with the loss scale taken out and before
  clipping; the update itself is clipped (grad_clip_norm's
  global_clipnorm)."""
  images = np.arange(GLOBAL_BATCH * 8 * 8 * 3).reshape(
      (GLOBAL_BATCH, 8, 8, 3)).astype(np.uint8)
  labels = np.arange(GLOBAL_BATCH).astype(np.int32) % NUM_CLASSES
  goal = objective.Objective(NUM_CLASSES)
  keras.utils.set_random_seed(1)
  with mirrored.scope():
    model = _dense_model()
    optimizer = keras.optimizers.SGD(1.0, global_clipnorm=1e-3)
    if loss_scaled:
      optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(goal.per_example_loss()(
        goal.targets(labels), model(images, training=True)))
  grads = tape.gradient(loss, model.trainable_variables)
  expected = float(tf.linalg.global_norm(grads))
  before = [v.numpy().copy() for v in model.trainable_variables]
  train = steps.make_train_function(model, optimizer, mirrored, GLOBAL_BATCH,
                                    goal, step, jit_compile=False)

  def dataset(input_context):
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        input_context.get_per_replica_batch_size(GLOBAL_BATCH))

  out = train(iter(mirrored.distribute_datasets_from_function(dataset)),
              tf.constant(1))
  assert expected > 1e-2  # Far above the clip: clipping shows.
  assert float(out['grad_norm']) == pytest.approx(expected, rel=1e-4)
  moved = np.sqrt(sum(np.sum((v.numpy() - b) ** 2) for v, b in
                      zip(model.trainable_variables, before)))
  assert moved == pytest.approx(1e-3, rel=1e-3)  # lr 1 x the clipped norm.
