"""The stages of launch.probe (probe.py says what each measures): each a
function of the Probe and the policy, returning its figures."""

import os
import tempfile
import time

import jax
import keras
import numpy as np

from pipeline.backends import hlo_cost
from pipeline.backends.jax import programs
from pipeline.backends.jax import staging as staging_lib
from pipeline.probe import kernel_times
from pipeline.probe import picks as picks_lib
from pipeline.probe import step_profile
from pipeline.backends.jax.programs import on_host
from pipeline.recipe import models
from pipeline.recipe import optimizers
from pipeline.rules.machine import peaks
from pipeline.rules.speed import precision
from pipeline.rules.speed import step_counts


def make_optimizer(config, policy):
  """The config's optimizer over a long run's schedule, loss-scaled where
  the policy computes in float16."""
  return precision.wrap_optimizer(
      optimizers.make_optimizer(config, config.base_learning_rate *
                                config.global_batch_size / 256, 100_000,
                                1000), policy)


def _by_steps(step):
  """An execution as the trainer runs it: `step` dispatched per batch."""
  def execution(state, batches):
    outputs = []
    for images, labels in batches:
      state, output = step(state, images, labels)
      outputs.append(output)
    return state, outputs
  return execution


def _timed(execution, state, batches, executions):
  """Runs `execution` `executions` times on the same on-device batches;
  (state, seconds) from the first dispatch to the last output."""
  begin = time.perf_counter()
  for _ in range(executions):
    state, outputs = execution(state, batches)
  jax.block_until_ready(outputs)
  return state, time.perf_counter() - begin


def _compiled_step(setup, state, batches):
  """(the step compiled for these shapes, seconds it took)."""
  began = time.perf_counter()
  compiled = setup.step.lower(state, *batches[0]).compile()
  return compiled, time.perf_counter() - began


def timed_step(probe, setup):
  """Compiles `setup`'s step for its batches, times it on batches already on
  the devices, keeps the program and the state it left (setup.compiled,
  setup.trained_state: each program donates what it takes); its figures."""
  batches = probe.on_devices(probe.slots, setup.shape)
  state = setup.state()
  setup.compiled, compile_s = _compiled_step(setup, state, batches)
  setup.batches = batches
  execution = _by_steps(setup.compiled)
  state, first_s = _timed(execution, state, batches, 1)
  state, seconds = _timed(execution, state, batches, probe.executions)
  setup.trained_state = state
  return {'policy': setup.policy, 'compile_s': round(compile_s, 1),
          'first_execution_s': round(first_s, 2),
          'images_per_sec': round(probe.images(
              probe.executions, batch=setup.shape[0]) / seconds, 1),
          'steps_per_execution': probe.slots,
          'global_batch_size': setup.config.global_batch_size}


def retimed(probe, setup):
  """images/s of `setup`'s compiled step, timed again now."""
  execution = _by_steps(setup.compiled)
  setup.trained_state, seconds = _timed(execution, setup.trained_state,
                                        setup.batches, probe.executions)
  return probe.images(probe.executions, batch=setup.shape[0]) / seconds


def device_rate(probe, policy):
  """(a): the step compiled, then timed on batches already on the
  devices."""
  setup = probe.setup(policy)
  figures = timed_step(probe, setup)
  probe.compile_s = figures['compile_s']
  setup.state_spec = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      setup.trained_state)
  probe.device_images_per_sec = figures['images_per_sec']
  figures.update(picks_lib.convolution_picks(probe, setup.compiled.as_text()))
  return figures


def _fed(probe, execution, state, executions):
  """Executions fed from host arrays as the trainer feeds them: take the
  staged batches, dispatch, stage the next while they run, wait."""
  staging = staging_lib.Staging(probe.strategy,
                                step_counts.STAGED_INPUT_BYTES_PER_DEVICE)
  stream = probe.host_stream()
  staging.stage(stream, probe.slots, ())
  wait_s = idle_s = dispatch_s = 0.0
  begin = time.perf_counter()
  for _ in range(executions):
    batches, _, waited = staging.take(stream, probe.slots)
    dispatched = time.perf_counter()
    state, outputs = execution(state, batches)
    dispatch_s += time.perf_counter() - dispatched
    idle_s += staging.stage(stream, probe.slots, outputs)
    wait_s += waited
    jax.block_until_ready(outputs)
  seconds = time.perf_counter() - begin
  rate = probe.images(executions) / seconds
  return state, {
      'images_per_sec': round(rate, 1),
      'of_device_rate': round(rate / probe.device_images_per_sec, 3),
      'dispatch_returns_after_s': round(dispatch_s / executions, 4),
      'execution_s': round(seconds / executions, 4),
      'input_wait_s_per_execution': round((wait_s + idle_s) / executions, 4)}


def host_fed(probe, policy):
  """(h): (a)'s compiled step fed from host uint8 arrays through the
  trainer's staging, as a run feeds it; no other program compiled."""
  setup = probe.setup(policy)
  setup.trained_state, figures = _fed(probe, _by_steps(setup.compiled),
                                      setup.trained_state, probe.executions)
  return figures


def memory(probe, policy):
  """(c): the device's memory, the compiled step's, and the input staged
  beside it at two steps_per_execution (one execution's batches per
  device)."""
  setup = probe.setup(policy)
  stats = probe.device.memory_stats() or {}
  analysis = setup.compiled.memory_analysis()
  figures = {'memory_limit_bytes': stats.get('bytes_limit'),
             'peak_bytes_in_use_so_far': stats.get('peak_bytes_in_use'),
             'step_arguments_bytes': analysis.argument_size_in_bytes,
             'step_temporaries_bytes': analysis.temp_size_in_bytes,
             'step_outputs_bytes': analysis.output_size_in_bytes}
  batch = probe.strategy.bytes_per_device(probe.on_devices(1))
  for slots in (probe.slots, probe.slots * 4):
    staged = min(slots * batch, step_counts.STAGED_INPUT_BYTES_PER_DEVICE)
    figures[f'steps_per_execution_{slots}'] = {
        'staged_input_bytes': staged, 'running_input_bytes': slots * batch,
        'total_bytes': (analysis.argument_size_in_bytes +
                        analysis.temp_size_in_bytes + (slots - 1) * batch +
                        staged)}
  return figures


def flops(probe, policy):
  """(d): one micro-batch's forward and backward pass, counted before and
  after XLA compiles it for this device."""
  setup = probe.setup(policy)
  micro_batch = probe.config.global_batch_size
  images, labels = probe.strategy.to_devices(probe.host_batches[0])
  gradient = programs.gradient_program(setup.model, setup.optimizer,
                                        setup.objective, probe.strategy)
  lowered = gradient.lower(setup.state_spec, images, labels)
  unoptimized = hlo_cost.per_image(lambda: lowered.as_text(dialect='hlo'),
                                   micro_batch,
                                   lambda: jax.devices('cpu')[0].client)
  compiled = lowered.compile()
  analysis = compiled.cost_analysis() or {}
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  counted = analysis.get('flops')
  return {'unoptimized_flops_per_image': unoptimized.get('flops'),
          'unoptimized_counted': unoptimized.get('counted',
                                                 unoptimized.get('reason')),
          'compiled_flops_per_image': (counted / micro_batch
                                       if counted is not None else None),
          'compiled_custom_calls': compiled.as_text().count('custom-call('),
          'device': probe.device.device_kind}


def float16(probe, policy):
  """(e): mixed_float16 with the loss scale in the step."""
  del policy
  setup = probe.setup('mixed_float16')
  figures = timed_step(probe, setup)
  place = programs.optimizer_places(setup.optimizer)
  values = on_host({name: setup.trained_state.optimizer[i]
                    for name, i in place.items()})
  steps = int(on_host(setup.trained_state.step))
  return {'compile_s': figures['compile_s'],
          'images_per_sec': figures['images_per_sec'],
          'final_loss_scale': float(values['dynamic_scale']),
          'steps': steps, 'skipped_steps': steps - int(values['iterations'])}


def profiled(probe, setup, images_per_sec, trace_dir=None):
  """Where `setup`'s compiled step spends its time (step_profile.py): two
  executions traced, the trace read back and put in kernel classes; the
  bytes the step moves per image against the device's bandwidth at
  `images_per_sec`. The trace is kept in `trace_dir` (TensorBoard's
  profile plugin reads it) or dropped."""
  execution = _by_steps(setup.compiled)

  def run():
    for _ in range(2):
      setup.trained_state, outputs = execution(setup.trained_state,
                                               setup.batches)
    jax.block_until_ready(outputs)

  with tempfile.TemporaryDirectory() as scratch:
    trace = kernel_times.trace(run, trace_dir or scratch)
  text = setup.compiled.as_text()
  found = step_profile.instructions(text)
  batch = setup.config.global_batch_size
  devices = probe.strategy.num_replicas_in_sync
  classes = step_profile.classify(found, step_profile.layer_kinds(setup.model),
                                  batch // devices)
  events, on_device = kernel_times.kernel_events(
      trace, step_profile.module_name(text))
  figures = kernel_times.summarize(events, on_device, classes, 2 * probe.slots)
  # The compiled program is one device's share of the batch.
  moved = step_profile.bytes_moved(found, classes) * devices / batch
  figures.update(
      bytes_per_image=round(moved),
      bytes_counted=('operands and results of every instruction the '
                     'compiled step runs, each once: what it reads and '
                     'writes at least once'))
  found_peak = peaks.peak(probe.device.device_kind,
                          precision.is_16bit(setup.policy))
  if found_peak:
    bandwidth = found_peak[1] * devices
    figures.update(
        images_per_sec=images_per_sec, peak_bytes_per_sec=bandwidth,
        peak_source=found_peak[2],
        images_per_sec_at_peak_bandwidth=round(bandwidth / moved),
        fraction_of_peak_bandwidth=round(moved * images_per_sec / bandwidth,
                                         3))
  else:
    figures['peak_bytes_per_sec'] = (
        f'no figure for {probe.device.device_kind!r} '
        '(pipeline/rules/machine/peaks.py)')
  return figures


def profile(probe, policy):
  """(g): where (a)'s step spends its time; its trace under --out."""
  setup = probe.setup(policy)
  return profiled(probe, setup, probe.device_images_per_sec,
                  probe.out_dir and os.path.join(probe.out_dir, 'trace'))


def keras_fit(probe, policy):
  """(f): Keras' own model and trainer, the peer: the config's
  keras.applications network with its own top (none of this project's
  layers, so a faster layer of ours cannot speed it up too), compiled by
  model.fit with the same optimizer, batch and policy, fed the same host
  arrays. Its first epoch compiles; the second and third are timed, and
  (a)'s step is timed again before, between and after them, so a card's
  drift favours neither. Where (h) ran first, its host-fed rate against the
  peer too: the rate a user gets."""
  config = probe.config
  keras.mixed_precision.set_global_policy(policy)
  keras.utils.set_random_seed(config.seed)
  model = models.MODELS[config.model].with_its_top(
      config.model, probe.num_classes,
      (config.image_size, config.image_size, 3))
  model.compile(make_optimizer(config, policy),
                keras.losses.CategoricalCrossentropy(
                    label_smoothing=config.label_smoothing),
                jit_compile=True, steps_per_execution=probe.slots)
  steps = probe.slots * probe.executions
  images = np.concatenate([probe.host_batches[i % 4][0] for i in range(steps)])
  labels = np.concatenate([probe.host_batches[i % 4][1] for i in range(steps)])
  targets = np.eye(probe.num_classes, dtype=np.float32)[labels]
  ours = probe.setups.get(policy)
  timed = getattr(ours, 'compiled', None) is not None
  epochs, our_rates = [], []

  def between(epoch, *_):
    if epoch >= 1 and timed:  # Before the 2nd epoch, between, after.
      our_rates.append(retimed(probe, ours))
    epochs.append(time.perf_counter())

  timer = keras.callbacks.LambdaCallback(
      on_epoch_begin=between,
      on_epoch_end=lambda *_: epochs.append(time.perf_counter()))
  model.fit(images, targets, batch_size=config.global_batch_size, epochs=3,
            shuffle=False, verbose=0, callbacks=[timer])
  if timed:
    our_rates.append(retimed(probe, ours))
  first_s = epochs[1] - epochs[0]
  rates = [len(images) / (epochs[i + 1] - epochs[i]) for i in (2, 4)]
  rate = sum(rates) / len(rates)
  figures = {'model': f'keras.applications {model.name}', 'policy': policy,
             'first_epoch_s': round(first_s, 1),
             'images_per_sec': round(rate, 1),
             'images_per_sec_each_epoch': [round(r, 1) for r in rates]}
  if our_rates:
    ours_rate = sum(our_rates) / len(our_rates)
    figures.update(
        this_projects_step_alternating=[round(r, 1) for r in our_rates],
        this_projects_step_against_it=round(ours_rate / rate, 3))
  stages = probe.results['stages']
  host_fed = stages.get('h_host_fed', {}).get('images_per_sec')
  if host_fed:
    figures['this_projects_host_fed_step_against_it'] = round(
        host_fed / rate, 3)
  return figures


# letter: (name, stage, compilations it makes).
BY_LETTER = {'a': ('device_rate', device_rate, 1),
             'c': ('memory', memory, 0),
             'd': ('flops', flops, 1),
             'e': ('float16', float16, 1),
             'f': ('keras_fit', keras_fit, 1),
             'g': ('profile', profile, 0),
             'h': ('host_fed', host_fed, 0)}
