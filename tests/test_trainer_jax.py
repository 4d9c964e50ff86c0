"""The JAX trainer's compiled step, on a small model over two devices.

Runs in the JAX environment with KERAS_BACKEND=jax (CI's third
environment); skipped elsewhere. A Dense model compiles in seconds, so
these check the arithmetic exactly: one SGD step over two devices is one
step over the whole batch, micro-batches sum to the whole batch, an
execution runs exactly the steps asked for, the moving average warms up
as recipe/moving_average.py says, loss scaling is Keras' rule without its
branches, and training lowers the loss.
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
from pipeline.backends.jax import mesh  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import programs  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import ema as ema_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.backends.jax import trainer as trainer_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.recipe import moving_average  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.recipe import objective  # pylint: disable=g-import-not-at-top,wrong-import-position

CLASSES = 3


OBJECTIVE = objective.Objective(CLASSES)


def _model():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((4,)), keras.layers.Dense(CLASSES)])


def _state(model, optimizer, strategy, ema=None):
  return programs.initial_state(
      model, optimizer, strategy, np.int32(0),
      [v.value for v in moving_average.averaged(model)] if ema else None)


def _setup(learning_rate=0.5, ema_decay=0.0):
  model = _model()
  optimizer = keras.optimizers.SGD(learning_rate)
  optimizer.build(model.trainable_variables)
  strategy = mesh.DataParallel(jax.devices())
  ema = ema_jax.MovingAverage(model, ema_decay) if ema_decay else None
  return model, optimizer, strategy, ema, _state(model, optimizer, strategy,
                                                 ema)


def _batches(steps, batch=8, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(steps, batch, 4)).astype(np.float32)
  labels = rng.integers(0, CLASSES, size=(steps, batch)).astype(np.int32)
  return images, labels


def _run(step, strategy, state, images, labels, num_steps):
  """`num_steps` steps of the first of `images` and `labels` [steps, batch,
  ...]: (state, {'loss': their mean, 'step_losses'})."""
  losses = []
  for index in range(num_steps):
    state, (loss, *_) = step(state, *strategy.to_devices(
        (images[index], labels[index])))
    losses.append(float(loss))
  return state, {'loss': np.mean(losses), 'step_losses': np.array(losses)}


def test_two_devices_take_the_whole_batch_step():
  model, optimizer, strategy, _, state = _setup()
  assert strategy.num_replicas_in_sync == 2
  kernel, bias = [np.asarray(v) for v in state.trainable]
  images, labels = _batches(1)
  program = programs.train_step(model, optimizer, OBJECTIVE, strategy,
                                None)
  state, outputs = _run(program, strategy, state, images, labels, 1)

  def loss(kernel, bias):
    logits = images[0] @ kernel + bias
    return -jnp.mean(jax.nn.log_softmax(logits)[np.arange(8), labels[0]])

  grads = jax.grad(loss, argnums=(0, 1))(kernel, bias)
  np.testing.assert_allclose(state.trainable[0], kernel - 0.5 * grads[0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state.trainable[1], bias - 0.5 * grads[1],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(outputs['loss'], loss(kernel, bias), rtol=1e-5)
  assert int(state.step) == 1


def test_micro_batches_make_the_same_update():
  whole, micro = [], []
  for accumulation, out in ((1, whole), (2, micro)):
    model, optimizer, strategy, _, state = _setup()
    program = programs.train_step(model, optimizer, OBJECTIVE, strategy,
                                  None, accumulation=accumulation)
    state, outputs = _run(program, strategy, state, *_batches(3), 3)
    out.extend([np.asarray(state.trainable[0]), float(outputs['loss'])])
  np.testing.assert_allclose(micro[0], whole[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(micro[1], whole[1], rtol=1e-5)


def test_an_execution_runs_exactly_the_steps_asked_and_learns():
  model, optimizer, strategy, _, _ = _setup()
  step = programs.train_step(model, optimizer, OBJECTIVE, strategy, None)
  images, labels = _batches(1)
  trainer = _trainer(step, slots=8)
  first = trainer.train(iter([(images[0], labels[0])] * 20), 1)
  # 8 steps per execution, 5 of them asked for: a short last execution.
  outputs = trainer.train(iter([(images[0], labels[0])] * 20), 5)
  assert trainer.step == 6
  assert int(trainer.state.optimizer[0]) == 6  # SGD's iterations.
  losses = outputs['step_losses']
  assert losses.shape == (5,) and outputs['loss'] == pytest.approx(
      losses.mean())
  # Each step on the same batch lowers its loss (a zero learning rate or
  # gradient would leave it flat).
  assert losses[0] < first['loss'] and np.all(np.diff(losses) < 0)


def test_the_moving_average_warms_up_as_the_tensorflow_one():
  model, optimizer, strategy, ema, state = _setup(learning_rate=0.1,
                                                  ema_decay=0.99)
  program = programs.train_step(model, optimizer, OBJECTIVE, strategy,
                                ema)
  start = np.asarray(state.trainable[0])
  state, _ = _run(program, strategy, state, *_batches(1), 1)
  decay = min(0.99, 2 / 11)  # (1 + n) / (10 + n) after the first update.
  expected = decay * start + (1 - decay) * np.asarray(state.trainable[0])
  np.testing.assert_allclose(ema.values(state.ema)[0], expected, rtol=1e-5,
                             atol=1e-7)


def _float16_setup(initial_scale, growth_steps):
  model, optimizer, strategy, _, state = _setup()
  scaled = keras.optimizers.LossScaleOptimizer(
      optimizer, initial_scale=initial_scale,
      dynamic_growth_steps=growth_steps)
  scaled.build(model.trainable_variables)
  state = _state(model, scaled, strategy)
  program = programs.train_step(model, scaled, OBJECTIVE, strategy, None)
  place = programs.optimizer_places(scaled)
  return program, strategy, state, place


@pytest.mark.parametrize('loss_scaled', [False, True])
@pytest.mark.parametrize('accumulation', [1, 2])
def test_the_gradient_norm_is_the_whole_batchs_unscaled_and_unclipped(
    loss_scaled, accumulation):
  """The step's third output is the global norm of the whole batch's
  gradient over both devices (micro-batches summed), the loss scale taken
  out and before clipping; the update itself is clipped (grad_clip_norm's
  global_clipnorm, which Keras applies inside stateless_apply)."""
  model = _model()
  optimizer = keras.optimizers.SGD(1.0, global_clipnorm=1e-3)
  if loss_scaled:
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer,
                                                    initial_scale=2.0 ** 15)
  optimizer.build(model.trainable_variables)
  strategy = mesh.DataParallel(jax.devices())
  state = _state(model, optimizer, strategy)
  kernel, bias = [np.asarray(v) for v in state.trainable]
  images, labels = _batches(1)

  def loss(kernel, bias):
    logits = images[0] @ kernel + bias
    return -jnp.mean(jax.nn.log_softmax(logits)[np.arange(8), labels[0]])

  grads = jax.grad(loss, argnums=(0, 1))(kernel, bias)
  expected = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in grads)))
  program = programs.train_step(model, optimizer, OBJECTIVE, strategy, None,
                                accumulation=accumulation)
  state, (_, _, grad_norm) = program(state, *strategy.to_devices(
      (images[0], labels[0])))
  assert expected > 1e-2  # Far above the clip: clipping shows.
  assert float(grad_norm) == pytest.approx(expected, rel=1e-5)
  moved = np.sqrt(sum(np.sum((np.asarray(new) - old) ** 2) for new, old in
                      zip(state.trainable, (kernel, bias))))
  assert moved == pytest.approx(1e-3, rel=1e-3)  # lr 1 x the clipped norm.


def test_an_overflow_skips_the_update_and_halves_the_loss_scale():
  """float16's dynamic loss scaling in the compiled program: a scale so
  large the scaled gradients overflow float32 (inputs of a thousand make
  them hundreds) skips the step on every device (the weights and the
  applied-update count stay) and halves the scale; the step counter still
  counts it."""
  program, strategy, state, place = _float16_setup(3e38, 1000)
  kernel = np.asarray(state.trainable[0])
  images, labels = _batches(1)
  state, outputs = _run(program, strategy, state, images * 1000, labels, 1)
  np.testing.assert_array_equal(state.trainable[0], kernel)
  assert float(state.optimizer[place['dynamic_scale']]) == np.float32(1.5e38)
  assert int(state.optimizer[place['iterations']]) == 0
  assert int(state.step) == 1 and np.isfinite(outputs['loss'])


def test_the_loss_scale_doubles_after_its_growth_steps_of_good_ones():
  """Finite steps update the weights as unscaled gradients would, and the
  scale doubles after `dynamic_growth_steps` of them, not before."""
  program, strategy, state, place = _float16_setup(1024.0, 3)
  scales = []
  for _ in range(4):
    state, _ = _run(program, strategy, state, *_batches(1), 1)
    scales.append(float(state.optimizer[place['dynamic_scale']]))
  assert scales == [1024.0, 1024.0, 2048.0, 2048.0]
  assert int(state.optimizer[place['iterations']]) == 4
  model, optimizer, strategy, _, unscaled = _setup()
  plain = programs.train_step(model, optimizer, OBJECTIVE, strategy,
                              None)
  for _ in range(4):
    unscaled, _ = _run(plain, strategy, unscaled, *_batches(1), 1)
  np.testing.assert_allclose(state.trainable[0], unscaled.trainable[0],
                             rtol=1e-5, atol=1e-6)


def _host_waits(compiled):
  """The loops and branches of a compiled program that would wait on the
  host on a GPU: a `while` without a trip count XLA knows, a
  `conditional`."""
  lines = compiled.as_text().splitlines()
  return ([l for l in lines if ' while(' in l and 'known_trip_count' not in l]
          + [l for l in lines if ' conditional(' in l])


@pytest.mark.parametrize('schedule', ['cosine', 'exponential', 'linear'])
def test_a_step_holds_nothing_that_waits_on_the_host(schedule):
  """float16's loss scale, each schedule's warmup, the moving average and
  micro-batches, compiled: no loop of a runtime trip count, no branch
  (each would copy its predicate to the host on a GPU, every step). Keras'
  own loss-scaled apply, compiled alike, has its branch: what this test
  would see if the step took it."""
  from pipeline.recipe import optimizers  # pylint: disable=g-import-not-at-top
  config = types.SimpleNamespace(
      lr_schedule=schedule, warmup_epochs=1.0, lr_decay_epochs=1.0,
      lr_decay_rate=0.9, optimizer='adamw', weight_decay=0.01,
      grad_clip_norm=1.0)
  model = _model()
  optimizer = keras.optimizers.LossScaleOptimizer(
      optimizers.make_optimizer(config, 0.1, 100, 10))
  optimizer.build(model.trainable_variables)
  strategy = mesh.DataParallel(jax.devices())
  ema = ema_jax.MovingAverage(model, 0.99)
  state = _state(model, optimizer, strategy, ema)
  step = programs.train_step(
      model, optimizer, objective.Objective(CLASSES, 0.1, 1e-5), strategy,
      ema, accumulation=2)
  images, labels = strategy.to_devices((_batches(1)[0][0], _batches(1)[1][0]))
  assert _host_waits(step.lower(state, images, labels).compile()) == []

  grads = [jnp.ones(v.shape) for v in model.trainable_variables]
  keras_apply = jax.jit(optimizer.stateless_apply).lower(
      state.optimizer, grads, state.trainable).compile()
  assert any(' conditional(' in l for l in _host_waits(keras_apply))


@pytest.mark.parametrize('gradient', [1.0, np.inf])
@pytest.mark.parametrize('counter', [0, 2])
def test_loss_scaled_apply_is_keras_own_rule(gradient, counter):
  """Weights, the scale, its counter and the inner optimizer's state as
  Keras' LossScaleOptimizer.stateless_apply leaves them: a finite step
  (with and without growing the scale) and a skipped one."""
  model = _model()
  optimizer = keras.optimizers.LossScaleOptimizer(
      keras.optimizers.AdamW(0.1), initial_scale=64.0, dynamic_growth_steps=3)
  optimizer.build(model.trainable_variables)
  optimizer.step_counter.assign(counter)
  trainable = [v.value for v in model.trainable_variables]
  variables = [v.value for v in optimizer.variables]
  grads = [jnp.full(v.shape, gradient) for v in trainable]
  ours = programs.loss_scaled_apply(optimizer, variables, trainable, grads)
  theirs = optimizer.stateless_apply(variables, grads, trainable)
  for mine, keras_own in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_allclose(np.asarray(mine), np.asarray(keras_own),
                               rtol=1e-6)
  assert float(ours[1][3]) == {(1.0, 0): 64.0, (1.0, 2): 128.0}.get(
      (gradient, counter), 32.0)  # dynamic_scale


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
      recipe=None,  # None: it stops before reading one.
      frozen_steps=5, policy='mixed_float16',
      precision=types.SimpleNamespace(loss_scaling=True))
  with pytest.raises(UserError) as raised:
    trainer_jax.build(plan)
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
  strategy = mesh.DataParallel(jax.devices())
  state = _state(model, optimizer, strategy)
  frozen, thawed = [programs.train_step(
      model, optimizer, OBJECTIVE, strategy, None, frozen=phase)
                    for phase in (True, False)]
  assert all(v.trainable for v in model.weights if 'moving' not in v.path)

  variables = model.trainable_variables + model.non_trainable_variables
  in_backbone = [v.path.startswith(('stem', 'bn')) for v in variables]
  slot_in_backbone = [v.path.split('/')[-1].startswith(('stem', 'bn'))
                      for v in optimizer.variables]
  assert sum(in_backbone) == 6 and sum(slot_in_backbone) == 8  # 4 x m, v.

  def values(state):
    return ([np.asarray(x) for x in state.trainable +
             state.non_trainable],
            [np.asarray(x) for x in state.optimizer])

  before, slots_before = values(state)
  state, _ = _run(frozen, strategy, state, *_batches(2), 2)
  after, slots_after = values(state)
  for was, now, kept in zip(before, after, in_backbone):
    assert np.array_equal(was, now) == kept
  for was, now, kept in zip(slots_before, slots_after, slot_in_backbone):
    if kept:
      assert np.array_equal(was, now)
  assert int(state.step) == 2 and int(state.optimizer[0]) == 2

  state, _ = _run(thawed, strategy, state, *_batches(1, seed=1), 1)
  thawed_values, _ = values(state)
  assert not any(np.array_equal(was, now)
                 for was, now in zip(after, thawed_values))


def _cost_of(accumulation, last_inputs):
  model, optimizer, strategy, _, state = _setup()
  trainer = trainer_jax.Trainer(
      model, optimizer, strategy, state, None, None, CLASSES, 0, '',
      slots=4, accumulation=accumulation, last_inputs=last_inputs,
      gradient_program=programs.gradient_program(
          model, optimizer, OBJECTIVE, strategy))
  return trainer, trainer.step_cost()


def test_step_cost_counts_one_pass_per_image_whatever_the_micro_batches():
  """Counted before XLA optimises: the Dense layer's product forward
  (2 x 4 x 3 FLOPs an image) and its kernel's gradient (as many), plus the
  bias, softmax and loss; a step of 2 micro-batches counted as one pass
  would be 2x off."""
  batch = jax.ShapeDtypeStruct((8, 4), jnp.float32)
  labels = jax.ShapeDtypeStruct((8,), jnp.int32)
  costs = [_cost_of(accumulation, (batch, labels))[1]
           for accumulation in (1, 2)]
  assert 48 <= costs[0]['flops'] < 150, costs
  assert costs[1]['flops'] == pytest.approx(costs[0]['flops'], rel=0.2)
  assert costs[0]['bytes'] > 0
  assert costs[0]['counted'] == (
      "one micro-batch's forward and backward pass, counted from the "
      "unoptimized program (XLA's CPU cost model; bytes before fusion)")


def test_a_program_xla_cannot_analyse_is_a_reason_not_an_exception(
    monkeypatch):
  trainer, _ = _cost_of(1, (jax.ShapeDtypeStruct((8, 4), jnp.float32),
                            jax.ShapeDtypeStruct((8,), jnp.int32)))
  lowered = type(trainer.gradient_program.lower(
      trainer.state, *trainer.last_inputs))
  monkeypatch.setattr(lowered, 'as_text', lambda self, dialect=None: 'HloModule ?')
  reason = trainer.step_cost()['reason']
  assert reason.startswith('XLA could not analyse the step here (')
  assert _cost_of(1, None)[1] == {'reason': 'no training step has run'}


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


def test_the_next_execution_is_staged_before_its_outputs_are_awaited(
    monkeypatch):
  """The order that lets input move while the steps run (dispatch returns
  at once: on an H200, 8 steps' dispatches returned after 0.20 of their
  0.25 s, BUILD_NOTES.md): the steps are dispatched, the next execution's
  batches pulled and placed, and only then are the outputs fetched."""
  events = []
  fetch = trainer_jax.on_host
  monkeypatch.setattr(trainer_jax, 'on_host', lambda tree: (
      events.append('outputs fetched'), fetch(tree))[1])
  model, optimizer, strategy, _, _ = _setup()
  real = programs.train_step(model, optimizer, OBJECTIVE, strategy, None)

  def step(state, images, labels):
    events.append('step dispatched')
    return real(state, images, labels)

  images, labels = _batches(6)
  iterator, pulled = _counting(zip(images, labels))

  class Watched:
    def __next__(self):
      batch = next(iterator)
      events.append(f'batch {len(pulled)} pulled')
      return batch

  watched = Watched()
  trainer = _trainer(step)
  first = trainer.train(watched, 2)
  assert events == ['batch 1 pulled', 'batch 2 pulled', 'step dispatched',
                    'step dispatched', 'batch 3 pulled', 'batch 4 pulled',
                    'outputs fetched']
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
  real = programs.train_step(model, optimizer, OBJECTIVE, strategy, None)
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


@pytest.mark.parametrize('pipeline, memory_mib, preset, expected', [
    ('dali', [81559], None, '0.95'), ('dali', [15360, 16384], None, '0.73'),
    ('dali', [4096], None, '0.50'), ('tf.data', [81559], None, None),
    ('dali', [81559], '0.6', '0.6'), ('dali', [], None, None)])
def test_dali_keeps_its_share_of_the_gpus_jax_takes(
    pipeline, memory_mib, preset, expected, monkeypatch):
  """JAX takes 75% of each GPU as it starts; DALI decoding in the same
  process keeps 4 GiB of the smallest (stand-in GPUs: nvidia-smi's
  figures), a share the user set stays, tf.data's runs change nothing."""
  monkeypatch.setattr(devices_jax.hardware_lib, 'gpu_memory_mib',
                      lambda: memory_mib)
  environ = {} if preset is None else {devices_jax.MEMORY_FRACTION: preset}
  devices_jax.leave_room_for_dali(pipeline, environ)
  assert environ.get(devices_jax.MEMORY_FRACTION) == expected
