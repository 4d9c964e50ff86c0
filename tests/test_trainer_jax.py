"""The JAX trainer's compiled program, on a small model over two devices.

Runs in the JAX environment with KERAS_BACKEND=jax (CI's third
environment); skipped elsewhere. A Dense model compiles in seconds, so
these check the arithmetic exactly: one SGD step over two devices is one
step over the whole batch, micro-batches sum to the whole batch, the loop
runs exactly the steps asked for, the moving average warms up as
recipe/moving_average.py says, and training lowers the loss.
"""

import os
import types

import numpy as np
import pytest

jax = pytest.importorskip('jax', reason='runs in the JAX environment')
if os.environ.get('KERAS_BACKEND') != 'jax':
  pytest.skip('needs KERAS_BACKEND=jax before Keras is imported',
              allow_module_level=True)
jax.config.update('jax_num_cpu_devices', 2)

import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import keras  # pylint: disable=g-import-not-at-top,wrong-import-position

from pipeline.backends.jax import devices as devices_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import programs  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import ema as ema_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import trainer as trainer_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.storage import checkpoint_files  # pylint: disable=g-import-not-at-top,wrong-import-position

CLASSES = 3


def _config(accumulation=1):
  return types.SimpleNamespace(label_smoothing=0.0, l2_weight_decay=0.0,
                               gradient_accumulation_steps=accumulation)


def _setup(learning_rate=0.5, ema_decay=0.0):
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(CLASSES)])
  optimizer = keras.optimizers.SGD(learning_rate)
  optimizer.build(model.trainable_variables)
  strategy = devices_jax.DataParallel(jax.devices())
  step = checkpoint_files.Variables('step', shapes=[()], dtype='int32')
  ema = ema_jax.MovingAverage(model, ema_decay) if ema_decay else None
  state = trainer_jax._state_of(model, optimizer, step, ema, strategy)  # pylint: disable=protected-access
  return model, optimizer, strategy, ema, state


def _batches(steps, batch=8, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(steps, batch, 4)).astype(np.float32)
  labels = rng.integers(0, CLASSES, size=(steps, batch)).astype(np.int32)
  return images, labels


def _run(program, strategy, state, images, labels, num_steps):
  images, labels = strategy.to_devices([images, labels], stacked=True)
  return program(state, images, labels, np.int32(num_steps))


def test_two_devices_take_the_whole_batch_step():
  model, optimizer, strategy, _, state = _setup()
  assert strategy.num_replicas_in_sync == 2
  kernel, bias = [np.asarray(v) for v in state['trainable']]
  images, labels = _batches(1)
  program = programs.train_program(model, optimizer, _config(), CLASSES,
                                   strategy, None)
  state, outputs = _run(program, strategy, state, images, labels, 1)

  def loss(kernel, bias):
    logits = images[0] @ kernel + bias
    return -jnp.mean(jax.nn.log_softmax(logits)[np.arange(8), labels[0]])

  grads = jax.grad(loss, argnums=(0, 1))(kernel, bias)
  np.testing.assert_allclose(state['trainable'][0], kernel - 0.5 * grads[0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state['trainable'][1], bias - 0.5 * grads[1],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(outputs['loss'], loss(kernel, bias), rtol=1e-5)
  assert int(state['step']) == 1


def test_micro_batches_make_the_same_update():
  whole, micro = [], []
  for accumulation, out in ((1, whole), (2, micro)):
    model, optimizer, strategy, _, state = _setup()
    program = programs.train_program(
        model, optimizer, _config(accumulation), CLASSES, strategy, None)
    state, outputs = _run(program, strategy, state, *_batches(3), 3)
    out.extend([np.asarray(state['trainable'][0]), float(outputs['loss'])])
  np.testing.assert_allclose(micro[0], whole[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(micro[1], whole[1], rtol=1e-5)


def test_the_loop_runs_exactly_the_steps_asked_and_learns():
  model, optimizer, strategy, _, state = _setup()
  program = programs.train_program(model, optimizer, _config(), CLASSES,
                                   strategy, None)
  images, labels = _batches(1)
  repeated = np.repeat(images, 8, 0), np.repeat(labels, 8, 0)
  state, first = _run(program, strategy, state, *repeated, 1)
  # The same 8 slots, 5 of them used: a short last execution.
  state, outputs = _run(program, strategy, state, *repeated, 5)
  assert int(state['step']) == 6
  assert int(state['optimizer'][0]) == 6  # SGD's iterations.
  losses = np.asarray(outputs['step_losses'])
  assert np.all(losses[5:] == 0) and np.all(losses[:5] > 0)
  # Each step on the same batch lowers its loss (a zero learning rate or
  # gradient would leave it flat).
  assert losses[0] < float(first['loss']) and np.all(np.diff(losses[:5]) < 0)


def test_the_moving_average_warms_up_as_the_tensorflow_one():
  model, optimizer, strategy, ema, state = _setup(learning_rate=0.1,
                                                  ema_decay=0.99)
  program = programs.train_program(model, optimizer, _config(), CLASSES,
                                   strategy, ema)
  start = np.asarray(state['trainable'][0])
  state, _ = _run(program, strategy, state, *_batches(1), 1)
  decay = min(0.99, 2 / 11)  # (1 + n) / (10 + n) after the first update.
  expected = decay * start + (1 - decay) * np.asarray(state['trainable'][0])
  np.testing.assert_allclose(state['ema'][0], expected, rtol=1e-5, atol=1e-7)


def _float16_setup(initial_scale, growth_steps):
  model, optimizer, strategy, _, state = _setup()
  scaled = keras.optimizers.LossScaleOptimizer(
      optimizer, initial_scale=initial_scale,
      dynamic_growth_steps=growth_steps)
  scaled.build(model.trainable_variables)
  step = checkpoint_files.Variables('step', shapes=[()], dtype='int32')
  state = trainer_jax._state_of(model, scaled, step, None, strategy)  # pylint: disable=protected-access
  program = programs.train_program(model, scaled, _config(), CLASSES,
                                   strategy, None)
  place = programs.optimizer_places(scaled)
  return program, strategy, state, place


def test_an_overflow_skips_the_update_and_halves_the_loss_scale():
  """float16's dynamic loss scaling in the compiled program: a scale so
  large the scaled gradients overflow float32 (inputs of a thousand make
  them hundreds) skips the step on every device (the weights and the
  applied-update count stay) and halves the scale; the step counter still
  counts it."""
  program, strategy, state, place = _float16_setup(3e38, 1000)
  kernel = np.asarray(state['trainable'][0])
  images, labels = _batches(1)
  state, outputs = _run(program, strategy, state, images * 1000, labels, 1)
  np.testing.assert_array_equal(state['trainable'][0], kernel)
  assert float(state['optimizer'][place['dynamic_scale']]) == np.float32(1.5e38)
  assert int(state['optimizer'][place['iterations']]) == 0
  assert int(state['step']) == 1 and np.isfinite(outputs['loss'])


def test_the_loss_scale_doubles_after_its_growth_steps_of_good_ones():
  """Finite steps update the weights as unscaled gradients would, and the
  scale doubles after `dynamic_growth_steps` of them, not before."""
  program, strategy, state, place = _float16_setup(1024.0, 3)
  scales = []
  for _ in range(4):
    state, _ = _run(program, strategy, state, *_batches(1), 1)
    scales.append(float(state['optimizer'][place['dynamic_scale']]))
  assert scales == [1024.0, 1024.0, 2048.0, 2048.0]
  assert int(state['optimizer'][place['iterations']]) == 4
  model, optimizer, strategy, _, unscaled = _setup()
  plain = programs.train_program(model, optimizer, _config(), CLASSES,
                                 strategy, None)
  for _ in range(4):
    unscaled, _ = _run(plain, strategy, unscaled, *_batches(1), 1)
  np.testing.assert_allclose(state['trainable'][0], unscaled['trainable'][0],
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('capability, expected', [
    ('7.5', (7, 5)), ('9.0', (9, 0)), (None, None)])
def test_a_jax_gpu_gives_the_precision_rule_its_compute_capability(
    capability, expected):
  """No GPU here: a stand-in with the attributes JAX's CUDA devices carry."""
  device = types.SimpleNamespace(device_kind='Tesla T4',
                                 compute_capability=capability)
  assert devices_jax.gpu_fields(device) == {
      'gpu_name': 'Tesla T4', 'gpu_compute_capability': expected}


def test_float16_with_a_frozen_backbone_is_one_line_before_anything_is_built():
  """stateless_apply would move the frozen backbone's optimizer slots."""
  plan = types.SimpleNamespace(
      frozen_steps=5, policy='mixed_float16',
      precision=types.SimpleNamespace(loss_scaling=True))
  with pytest.raises(UserError) as raised:
    trainer_jax.build(None, plan)  # No config: it stops before reading one.
  assert str(raised.value) == (
      'freeze_backbone_epochs with --policy=mixed_float16 runs on '
      '--backend=tensorflow; on JAX use mixed_bfloat16 or float32 for '
      'fine-tuning')


def test_a_frozen_backbone_stays_as_it_is_until_it_thaws():
  """Fine-tuning's first phase: the backbone's weights, batch-norm
  statistics and optimizer slots stay as they were (weight decay included,
  which a zero gradient would not stop) while the head learns; the other
  program then trains both."""
  keras.utils.set_random_seed(0)
  inputs = keras.Input((4,))
  backbone = keras.Model(inputs, keras.layers.BatchNormalization(name='bn')(
      keras.layers.Dense(4, name='stem')(inputs)), name='backbone')
  model = keras.Model(inputs, keras.layers.Dense(CLASSES, name='head')(
      backbone(inputs)))
  optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.5)
  optimizer.build(model.trainable_variables)
  strategy = devices_jax.DataParallel(jax.devices())
  step = checkpoint_files.Variables('step', shapes=[()], dtype='int32')
  state = trainer_jax._state_of(model, optimizer, step, None, strategy)  # pylint: disable=protected-access
  frozen, thawed = [programs.train_program(
      model, optimizer, _config(), CLASSES, strategy, None, frozen=phase)
                    for phase in (True, False)]
  assert all(v.trainable for v in model.weights if 'moving' not in v.path)

  variables = model.trainable_variables + model.non_trainable_variables
  in_backbone = [v.path.startswith(('stem', 'bn')) for v in variables]
  slot_in_backbone = [v.path.split('/')[-1].startswith(('stem', 'bn'))
                      for v in optimizer.variables]
  assert sum(in_backbone) == 6 and sum(slot_in_backbone) == 8  # 4 x m, v.

  def values(state):
    return ([np.asarray(x) for x in state['trainable'] +
             state['non_trainable']],
            [np.asarray(x) for x in state['optimizer']])

  before, slots_before = values(state)
  state, _ = _run(frozen, strategy, state, *_batches(2), 2)
  after, slots_after = values(state)
  for was, now, kept in zip(before, after, in_backbone):
    assert np.array_equal(was, now) == kept
  for was, now, kept in zip(slots_before, slots_after, slot_in_backbone):
    if kept:
      assert np.array_equal(was, now)
  assert int(state['step']) == 2 and int(state['optimizer'][0]) == 2

  state, _ = _run(thawed, strategy, state, *_batches(1, seed=1), 1)
  thawed_values, _ = values(state)
  assert not any(np.array_equal(was, now)
                 for was, now in zip(after, thawed_values))


def test_step_cost_is_one_step_per_image_whatever_the_slots_and_micro_batches():
  costs = []
  for accumulation in (1, 2):
    model, optimizer, strategy, _, state = _setup()
    config = _config(accumulation)
    images, labels = strategy.to_devices(list(_batches(4)), stacked=True)
    trainer = trainer_jax.Trainer(
        model, optimizer, strategy, state, None, None, CLASSES, 0, '',
        slots=4, accumulation=accumulation, last_inputs=tuple(
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
            for a in (images, labels)),
        cost_program=programs.cost_program(model, optimizer, config, CLASSES,
                                           strategy, None))
    costs.append(trainer.step_cost())
  # The Dense layer's product forward and its two backward: 3 x 2 x 4 x 3
  # per image at least, plus the softmax and the update; 4 slots or 2
  # micro-batches counted as one step would be 4x or 2x off.
  assert 72 <= costs[0]['flops'] < 300, costs
  assert costs[1]['flops'] == pytest.approx(costs[0]['flops'], rel=0.2)
  assert costs[0]['bytes'] > 0
  assert costs[0]['counted'] == 'the compiled step on one device'


def test_a_device_without_cost_analysis_is_a_reason_not_an_exception(
    monkeypatch):
  """As on a PJRT plugin (CUDA, libtpu), whose compiled programs may give
  no analysis (None), or fail to (the CPU always gives one, so both are
  made here)."""
  model, optimizer, strategy, _, state = _setup()
  images, labels = strategy.to_devices(list(_batches(2)), stacked=True)
  trainer = trainer_jax.Trainer(
      model, optimizer, strategy, state, None, None, CLASSES, 0, '', slots=2,
      last_inputs=(images, labels), cost_program=programs.cost_program(
          model, optimizer, _config(), CLASSES, strategy, None))
  compiled = type(trainer.cost_program.lower(
      state, images[0], labels[0]).compile())
  monkeypatch.setattr(compiled, 'cost_analysis', lambda self: None)
  assert trainer.step_cost() == {
      'reason': 'cpu gives no cost analysis of the compiled step'}

  def fails(self):
    raise NotImplementedError('no cost analysis on this plugin')
  monkeypatch.setattr(compiled, 'cost_analysis', fails)
  assert trainer.step_cost() == {
      'reason': "XLA's cost analysis of the compiled step failed here "
                '(NotImplementedError: no cost analysis on this plugin)'}


def _counting(batches, fail_at=None):
  """Yields `batches` (images, labels), counting the pulls in `pulled`;
  raises ValueError at pull number `fail_at`."""
  pulled = []

  def generate():
    for images, labels in batches:
      pulled.append(len(pulled) + 1)
      if len(pulled) == fail_at:
        raise ValueError(f'bad batch {fail_at}')
      yield images, labels
  return generate(), pulled


def _trainer(program, slots=2):
  model, optimizer, strategy, _, state = _setup()
  return trainer_jax.Trainer(model, optimizer, strategy, state, program,
                             None, CLASSES, 0, '', slots=slots)


def test_the_next_execution_is_staged_while_the_program_runs():
  """The program cannot finish until the input is asked for the next
  execution's first batch: a trainer that waited for the outputs before
  staging would wait 20 s here, and fail."""
  import threading  # pylint: disable=g-import-not-at-top
  from jax.experimental import io_callback  # pylint: disable=g-import-not-at-top
  staged = threading.Event()
  seen = []

  def wait_for_staging(loss):
    seen.append(staged.wait(timeout=20))
    return np.asarray(loss)

  model, optimizer, strategy, _, _ = _setup()
  real = programs.train_program(model, optimizer, _config(), CLASSES,
                                strategy, None)
  blocked = jax.jit(lambda loss: io_callback(
      wait_for_staging, jax.ShapeDtypeStruct((), jnp.float32), loss))

  def program(state, images, labels, num_steps):
    state, outputs = real(state, images, labels, num_steps)
    return state, dict(outputs, loss=blocked(outputs['loss']))

  images, labels = _batches(6)
  iterator, pulled = _counting(zip(images, labels))
  trainer = _trainer(program)
  original_next = iterator.__next__

  class Watched:
    def __next__(self):
      batch = original_next()
      if len(pulled) == 3:  # The first batch of the second execution.
        staged.set()
      return batch

  watched = Watched()
  first = trainer.train(watched, 2)
  assert seen == [True] and len(pulled) == 4  # Two staged while it ran.
  second = trainer.train(watched, 2)  # Takes the staged ones.
  assert trainer.step == 4 and len(pulled) == 6
  # The staged batches are the next ones, in order: the same as training
  # the six batches without staging.
  model, optimizer, strategy, _, state = _setup()
  state, expected = _run(real, strategy, state, images[:2], labels[:2], 2)
  state, expected_second = _run(real, strategy, state, images[2:4],
                                labels[2:4], 2)
  np.testing.assert_allclose(first['loss'], float(expected['loss']),
                             rtol=1e-6)
  np.testing.assert_allclose(second['loss'], float(expected_second['loss']),
                             rtol=1e-6)


def test_a_failure_while_staging_is_raised_by_the_execution_that_takes_it():
  model, optimizer, strategy, _, _ = _setup()
  real = programs.train_program(model, optimizer, _config(), CLASSES,
                                strategy, None)
  images, labels = _batches(5)
  iterator, pulled = _counting(zip(images, labels), fail_at=4)
  trainer = _trainer(real)
  trainer.train(iterator, 2)  # Pulls 1-2, stages 3 and fails at 4.
  assert len(pulled) == 4 and trainer.step == 2
  with pytest.raises(ValueError, match='bad batch 4'):
    trainer.train(iterator, 2)  # Batch 3 is there; 4 is the failure.
  # The end of the data likewise: StopIteration where the data ran out.
  iterator, pulled = _counting(zip(images[:3], labels[:3]))
  trainer = _trainer(real)
  trainer.train(iterator, 2)
  with pytest.raises(StopIteration):
    trainer.train(iterator, 2)


def test_a_jax_run_reports_its_accelerators_peak_memory_not_the_hosts(
    monkeypatch):
  """JAX's allocator counts a GPU's or TPU's peak (memory_stats); a CPU
  counts none, and metrics.json falls back to the host's RSS. The device
  is a stand-in here (this machine has no accelerator)."""
  import types as types_lib  # pylint: disable=g-import-not-at-top
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  from pipeline.reports import metrics  # pylint: disable=g-import-not-at-top
  backend = backends.load('jax')
  cpu = types_lib.SimpleNamespace(device_kind='CPU')
  assert backend.peak_device_memory(cpu) is None
  assert metrics.peak_memory(backend, cpu)['peak_memory_kind'] == 'host RSS'
  gpu = types_lib.SimpleNamespace(
      memory_stats=lambda: {'peak_bytes_in_use': 12345})
  monkeypatch.setattr(jax, 'local_devices', lambda: [gpu])
  assert metrics.peak_memory(backend, types_lib.SimpleNamespace(
      device_kind='GPU')) == {'peak_memory_bytes': 12345,
                              'peak_memory_kind': 'GPU:0 device'}
