"""The training recipe's parts, each on the smallest real thing it acts on.

Stochastic depth and EfficientNetV2 on keras.applications' own networks; the
moving average, gradient accumulation and L2 on a small model under a real
MirroredStrategy over 2 logical CPUs (no batch norm or dropout where two
computations must agree exactly); mixup and CutMix on batches whose pixels
say where they came from; weights files loaded into the backbone.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from configs import default
from pipeline.data.augmentations import tf_data as augment
from pipeline.backends.tensorflow import ema as ema_lib
from pipeline.recipe import finetune
from pipeline.recipe import models
from pipeline.recipe import objective
from pipeline.recipe import schedules
from pipeline.backends.tensorflow import steps
from pipeline.storage.checkpoint import Checkpointer
from pipeline.storage.workdirs import Workdir

from conftest import tensorflow_files

NUM_CLASSES = 4
BATCH = 8


@pytest.fixture
def mirrored():
  # Each strategy its own collective key range (as tests/test_steps.py).
  tf.distribute.MirroredStrategy._collective_key_base += 10_000  # pylint: disable=protected-access
  return tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])


def _dense_model():
  images = keras.Input((4, 4, 3), dtype='uint8')
  x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(images))
  return keras.Model(images, keras.layers.Dense(NUM_CLASSES)(x))


def _batch(seed=0, size=BATCH):
  rng = np.random.RandomState(seed)
  return (rng.randint(0, 256, (size, 4, 4, 3)).astype(np.uint8),
          rng.randint(0, NUM_CLASSES, size).astype(np.int32))


def _train(strategy, batches, optimizer_fn, **recipe):
  """Trains the dense model one step per batch; returns (model, optimizer,
  ema, step)."""
  keras.utils.set_random_seed(1)
  with strategy.scope():
    model = _dense_model()
    optimizer = optimizer_fn()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    ema = (ema_lib.MovingAverage(model, recipe.pop('ema_decay'))
           if 'ema_decay' in recipe else None)
  goal = objective.Objective(NUM_CLASSES, 0.0,
                             recipe.pop('l2_weight_decay', 0.0))
  train = steps.make_train_function(model, optimizer, strategy, BATCH, goal,
                                    step, jit_compile=False, ema=ema, **recipe)
  images = np.concatenate([b[0] for b in batches])
  labels = np.concatenate([b[1] for b in batches])

  def dataset(context):
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        context.get_per_replica_batch_size(BATCH))

  train(iter(strategy.distribute_datasets_from_function(dataset)),
        tf.constant(len(batches)))
  return model, optimizer, ema, step


def test_drop_connect_rate_reaches_every_block():
  def block_rates(rate):
    network = models.backbone(models.build_model(
        'efficientnet_b0', 10, 32, dropout_rate=0.0, drop_connect_rate=rate))
    return [(layer.name, layer.rate) for layer in network.layers
            if isinstance(layer, keras.layers.Dropout)]

  # keras.applications gives block b of 16 the rate 0.2 * b / 16 and runs
  # Dropout only in the 9 repeated blocks; a rate of ours scales all 9.
  built_blocks = (2, 4, 6, 7, 9, 10, 12, 13, 14)
  for rate in (0.3, 0.05, 0.0):
    rates = block_rates(rate)
    assert [name[:6] for name, _ in rates] == [
        f'block{n}' for n in (2, 3, 4, 4, 5, 5, 6, 6, 6)]
    np.testing.assert_allclose([r for _, r in rates],
                               [rate * b / 16 for b in built_blocks],
                               rtol=1e-6, atol=1e-12)

  # The rate is read when a block runs: with no dropout at all, two
  # training-mode passes agree; with stochastic depth they do not.
  images = np.random.RandomState(0).randint(0, 256, (4, 32, 32, 3)).astype(
      np.uint8)
  for rate, same in ((0.0, True), (0.5, False)):
    model = models.build_model('efficientnet_b0', 10, 32, dropout_rate=0.0,
                               drop_connect_rate=rate)
    first, second = (model(images, training=True).numpy() for _ in range(2))
    assert np.allclose(first, second) == same, rate


@pytest.mark.parametrize('name', [
    # Each takes 5 to 17 s to build twice: the fast suite keeps the
    # smallest, the slow tier builds every size.
    n if n == 'efficientnetv2_b0' else pytest.param(n, marks=pytest.mark.slow)
    for n in models.MODELS if n.startswith('efficientnetv2_')])
def test_every_v2_model_builds_with_a_float32_head(name):
  for policy in ('float32', 'mixed_bfloat16'):
    keras.mixed_precision.set_global_policy(policy)
    try:
      model = models.build_model(name, 7, 32, drop_connect_rate=0.1)
      logits = model(np.zeros((2, 32, 32, 3), np.uint8), training=False)
    finally:
      keras.mixed_precision.set_global_policy('float32')
    assert logits.shape == (2, 7) and logits.dtype == tf.float32, policy
    assert model.get_layer('logits').dtype_policy.compute_dtype == 'float32'
    # Every variable stays float32 (the moving average relies on it).
    assert {v.dtype for v in model.weights if 'seed' not in v.path} == {
        'float32'}, policy
    blocks = [layer for layer in models.backbone(model).layers
              if isinstance(layer, keras.layers.Dropout)]
    # Half of keras.applications' 0.2 (which its V2-B1 to B3 overshoot,
    # up to 0.295 at the deepest block of B3).
    assert blocks and 0.09 < max(layer.rate for layer in blocks) < 0.15


def test_accumulated_micro_batches_make_the_same_update(mirrored):
  """k micro-batches of b accumulated = one step of k*b, under SGD."""
  batch = _batch()
  sgd = lambda: keras.optimizers.SGD(0.5)
  whole, _, _, _ = _train(tf.distribute.get_strategy(), [batch], sgd)
  for strategy, k in ((tf.distribute.get_strategy(), 4), (mirrored, 2)):
    accumulated, optimizer, _, step = _train(strategy, [batch], sgd,
                                             accumulation_steps=k)
    assert int(optimizer.iterations.numpy()) == 1 and int(step.numpy()) == 1
    for mine, theirs in zip(accumulated.weights, whole.weights):
      np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5,
                                 atol=1e-6)
  untrained = _dense_model()
  assert not np.allclose(untrained.layers[-1].kernel.numpy(),
                         whole.layers[-1].kernel.numpy())


def test_l2_weight_decay_is_counted_once_over_replicas(mirrored):
  batch = _batch()
  sgd = lambda: keras.optimizers.SGD(0.5)
  single, _, _, _ = _train(tf.distribute.get_strategy(), [batch], sgd,
                           l2_weight_decay=0.1)
  split, _, _, _ = _train(mirrored, [batch], sgd, l2_weight_decay=0.1,
                          accumulation_steps=2)
  plain, _, _, _ = _train(tf.distribute.get_strategy(), [batch], sgd)
  kernel = lambda model: model.layers[-1].kernel.numpy()
  np.testing.assert_allclose(kernel(split), kernel(single), rtol=1e-5,
                             atol=1e-6)
  # The decay's own pull: w -= lr * l2 * w, on top of the loss gradient.
  keras.utils.set_random_seed(1)
  initial = kernel(_dense_model())
  np.testing.assert_allclose(kernel(single) - kernel(plain),
                             -0.5 * 0.1 * initial, rtol=1e-4, atol=1e-6)


def test_moving_average_follows_applied_updates_on_every_replica(mirrored):
  """After two SGD updates the average is the warmed-up EMA of the weights,
  equal on both replicas; a step the loss scale skips leaves it alone."""
  batches = [_batch(1), _batch(2)]
  model, _, average, _ = _train(mirrored, batches,
                                lambda: keras.optimizers.SGD(0.5),
                                ema_decay=0.9)
  keras.utils.set_random_seed(1)
  w0 = _dense_model().layers[-1].kernel.numpy()
  after_one, _, _, _ = _train(tf.distribute.get_strategy(), batches[:1],
                              lambda: keras.optimizers.SGD(0.5))
  w1, w2 = after_one.layers[-1].kernel.numpy(), model.layers[-1].kernel.numpy()
  # decay(n) = min(0.9, (1 + n) / (10 + n)): 2/11 after one, 3/12 after two.
  expected = w0
  for n, w in ((1, w1), (2, w2)):
    decay = min(0.9, (1 + n) / (10 + n))
    expected = decay * expected + (1 - decay) * w
  kernel_average = average.averages_of([model.layers[-1].kernel])[0]
  replicas = mirrored.experimental_local_results(kernel_average)
  assert len(replicas) == 2
  for value in replicas:
    np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, atol=1e-6)
  assert not np.allclose(expected, w2)

  # What evaluation and the export see; the model's own weights after.
  with average.applied_to_model():
    np.testing.assert_allclose(model.layers[-1].kernel.numpy(), expected,
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), w2)

  # Under float16 a loss scale of 2**127 overflows the gradients: the loss
  # scale skips the step, and the average stays where it was.
  keras.mixed_precision.set_global_policy('mixed_float16')
  try:
    model, optimizer, average, step = _train(
        mirrored, batches[:1],
        lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.5), initial_scale=2.0 ** 127),
        ema_decay=0.9)
  finally:
    keras.mixed_precision.set_global_policy('float32')
  assert int(step.numpy()) == 1 and int(optimizer.iterations.numpy()) == 0
  np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), w0)
  np.testing.assert_array_equal(
      average.averages_of([model.layers[-1].kernel])[0].numpy(), w0)


def test_a_checkpoint_without_an_average_starts_it_from_its_weights(tmp_path):
  workdir = Workdir(str(tmp_path), str(tmp_path))
  model = _dense_model()
  Checkpointer(workdir, 2, True, tensorflow_files(model=model)).save(3)
  saved = model.layers[-1].kernel.numpy()
  fresh = _dense_model()
  average = ema_lib.MovingAverage(fresh, 0.99)
  started = []
  restorer = Checkpointer(
      workdir, 2, True, tensorflow_files(model=fresh, ema=average.trackable),
      if_missing={'ema': lambda path: (started.append(path), average.reset())})
  assert restorer.restore_latest() == 3
  assert started == [str(tmp_path / 'checkpoints' / 'ckpt-3')]
  np.testing.assert_array_equal(
      average.averages_of([fresh.layers[-1].kernel])[0].numpy(), saved)


def test_mixup_and_cutmix_blend_images_and_labels_alike():
  """Batch images 0 (all 0) and 1 (all 255) are each other's partners."""
  images = np.stack([np.zeros((8, 8, 3), np.uint8),
                     np.full((8, 8, 3), 255, np.uint8)])
  labels = np.array([0, 1], np.int32)
  batch = (tf.constant(images), tf.constant(labels), tf.constant([0, 0]))
  for mixup, cutmix, expected in ((0.4, 0.0, {'blend'}),
                                  (0.0, 1.0, {'cut'}),
                                  (0.4, 1.0, {'blend', 'cut'})):
    mix = augment.mixer(mixup, cutmix, 3, 8)  # pylint: disable=protected-access
    seen = set()
    for index in range(20):
      mixed, soft, _ = (t.numpy() for t in mix(batch, tf.constant(
          [0, index], tf.int64)))
      assert mixed.dtype == np.uint8 and soft.shape == (2, 3)
      np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)
      levels = set(np.unique(mixed[0]).tolist())
      kind = ('unchanged' if len(levels) == 1 and levels <= {0, 255} else
              'cut' if levels == {0, 255} else 'blend')
      seen.add(kind)
      # Image 0's label weight on class 1 is its share of image 1's pixels
      # (a blend rounds each pixel to the nearest of 256 levels).
      share = mixed[0].astype(np.float64).mean() / 255
      assert abs(share - soft[0, 1]) <= (0 if kind == 'cut' else 1 / 510) + 1e-6
      # Deterministic: the same seed, the same batch.
      again = mix(batch, tf.constant([0, index], tf.int64))[0].numpy()
      np.testing.assert_array_equal(again, mixed)
    assert seen - {'unchanged'} == expected, (mixup, cutmix, seen)


def test_backbone_weights_from_a_file_arrive(tmp_path):
  keras.utils.set_random_seed(1)
  trained = models.build_model('efficientnet_b0', 10, 32)
  path = str(tmp_path / 'backbone.weights.h5')
  models.backbone(trained).save_weights(path)
  keras.utils.set_random_seed(2)
  model = models.build_model('efficientnet_b0', 3, 64)
  config = default.get_config()
  config.update(model='efficientnet_b0', image_size=64, init_from=path)
  assert finetune.load_init_from(finetune.FineTuning.of(config), model, (),
                                 str(tmp_path)) == (
      f'backbone from the weights file {path}')
  for mine, theirs in zip(models.backbone(model).weights,
                          models.backbone(trained).weights):
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
  assert models.backbone(model).weights  # Not vacuous.
  config.init_from = str(tmp_path / 'missing.h5')
  with pytest.raises(Exception, match='no such weights file'):
    finetune.load_init_from(finetune.FineTuning.of(config), model, (),
                            str(tmp_path))


@pytest.mark.parametrize('warmup_steps, decay_steps', [(5, 20), (0, 10)])
def test_the_warmup_cosine_schedule_is_keras_own_without_its_branch(
    warmup_steps, decay_steps):
  """Keras' CosineDecay with warmup is a `cond` (a host round trip per step
  on a GPU); ours selects, and gives the same rates, past the end too."""
  from pipeline.recipe import optimizers  # pylint: disable=g-import-not-at-top
  ours = schedules.WarmupCosineDecay(0.3, warmup_steps, decay_steps)
  theirs = keras.optimizers.schedules.CosineDecay(
      0.0, decay_steps, warmup_target=0.3, warmup_steps=warmup_steps)
  steps = range(warmup_steps + decay_steps + 3)
  np.testing.assert_allclose([float(ours(s)) for s in steps],
                             [float(theirs(s)) for s in steps], atol=1e-7)


@pytest.mark.parametrize('warmup_steps, decay_steps', [(5, 20), (0, 10)])
def test_the_linear_schedule_warms_up_then_falls_straight_to_zero(
    warmup_steps, decay_steps):
  """After its warmup, Keras' PolynomialDecay of power 1 to 0."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from pipeline.recipe import optimizers  # pylint: disable=g-import-not-at-top
  ours = schedules.WarmupLinearDecay(0.3, warmup_steps, decay_steps)
  line = keras.optimizers.schedules.PolynomialDecay(0.3, decay_steps, 0.0)
  np.testing.assert_allclose(
      [float(ours(s)) for s in range(warmup_steps)],
      [0.3 * s / warmup_steps for s in range(warmup_steps)], atol=1e-7)
  after = range(warmup_steps, warmup_steps + decay_steps + 3)
  np.testing.assert_allclose([float(ours(s)) for s in after],
                             [float(line(s - warmup_steps)) for s in after],
                             atol=1e-7)
  config = ml_collections.ConfigDict(dict(
      lr_schedule='linear', warmup_epochs=1.0, lr_decay_epochs=1.0,
      lr_decay_rate=0.97))
  made = schedules.learning_rate_schedule(
      schedules.SCHEDULES.settings(config), config.warmup_epochs, 0.3, 40, 10)
  assert [round(float(made(s)), 6) for s in (0, 5, 10, 25, 40)] == [
      0.0, 0.15, 0.3, 0.15, 0.0]
