"""What the JAX route does on whatever accelerator JAX sees, measured in a
few minutes with nothing but JAX and Keras: launch.probe.

Stages, most decisive first, each written to `probe.json` as it ends (a
run cut off still returns what it measured):

  a  compile time and images/s on batches already on the devices
  c  the device's memory limit, the compiled step's memory, and the input
     held beside it at two steps_per_execution
  d  FLOPs per image: the compiled program's count beside the unoptimized
     program's, and the custom calls the compiled one holds
  e  float16 with dynamic loss scaling: images/s, final scale, skipped steps
  f  Keras' own model (keras.applications, its own top) with model.fit,
     the same batch, policy and optimizer: the peer every speed claim is
     a ratio to
  g  where (a)'s step spends its time: a few steps traced, device time by
     kernel class, kernels and idle time per step, bytes moved per image
     against the device's bandwidth (step_profile.py)
  h  (a)'s program fed from host uint8 arrays through staging, as a run
     feeds it: input wait, how long the dispatches of an execution take
     to return, and the rate against (a)'s

Then the variants (variants.py): the same step with some config
keys, the policy or XLA's flags changed, each timed beside (a)'s step
re-timed just before it, and profiled too where (g) is asked for.

A stage that would not end within the budget is skipped with its reason.
Imports no TensorFlow: it runs on a bare JAX image plus a few wheels.
"""

import json
import os
import time

import jax
import keras
import numpy as np

from pipeline.backends.jax import ema as ema_lib
from pipeline.backends.jax import mesh
from pipeline.backends.jax import programs
from pipeline.probe import picks as picks_lib
from pipeline.probe import repeats as repeats_lib
from pipeline.probe import stages as probe_stages
from pipeline.probe import variants as probe_variants
from pipeline.backends.jax import JaxBackend
from pipeline.recipe import models
from pipeline.recipe import moving_average
from pipeline.recipe import objective
from pipeline.rules.speed import saved_policy
from pipeline.rules.speed import saved_rate

STAGES = 'acdefgh'
# The variants' policies: what a run on an accelerator may train under.
VARIANT_POLICIES = ('mixed_bfloat16', 'mixed_float16', 'float32')


def parse_variants(texts, config):
  """probe_variants.Variant of each text; ValueError in one line."""
  return [probe_variants.parse(text, config, VARIANT_POLICIES)
          for text in texts]


def run_all(config, num_classes, slots, executions, budget_s, save, out_dir,
            stages, policy, variants, own_process_flags, repeats=1,
            loaded_picks=None, keep_hlo=False):
  """The probe: the `repeats` - 1 fresh processes of stage (a) and the
  variants with XLA flags first, each in its own process
  (`own_process_flags`: launch.probe's flags for it) before this one takes
  the devices; then `stages` and the other variants here, and the spread
  of (a) over this process and the fresh ones. Returns the Probe, its
  figures saved by `save` as each ends."""
  began = time.perf_counter()
  own = [v for v in variants if v.xla_flags]
  # Each process apart gets an equal share of what the budget then leaves,
  # this one a share too.
  share_s = budget_s / (len(own) + repeats)
  fresh = repeats_lib.in_fresh_processes(
      repeats - 1, own_process_flags, share_s * (repeats - 1), out_dir,
      'g' in stages)
  apart = {}
  for index, variant in enumerate(own):
    apart[variant.name] = probe_variants.in_own_process(
        variant, own_process_flags, share_s,
        os.path.join(out_dir, f'variant-{index}'), 'g' in stages)
    save({'variants': apart}, 'variants', variant.name)
  runner = Probe(config, num_classes, slots, executions,
                 budget_s - (time.perf_counter() - began), save, out_dir)
  runner.loaded_picks, runner.keep_hlo = loaded_picks, keep_hlo
  print(f'probe: {json.dumps(runner.results["machine"])}', flush=True)
  save(runner.results)
  runner.run(stages, policy, [v for v in variants if not v.xla_flags], apart)
  if repeats > 1:
    runner.record_repeats(fresh)
  return runner


class Setup:
  """The model, optimizer and programs of one policy, built as a run
  builds them (programs.py), over every device JAX sees."""

  def __init__(self, config, num_classes, policy, strategy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(config.seed)
    self.config, self.num_classes, self.strategy = config, num_classes, strategy
    self.policy = policy
    self.model = models.model_of_config(config, num_classes,
                                        config.image_size)
    self.optimizer = probe_stages.make_optimizer(config, policy)
    self.optimizer.build(self.model.trainable_variables)
    self.ema = (ema_lib.MovingAverage(self.model, config.ema_decay)
                if config.ema_decay else None)
    self.objective = objective.Objective(
        num_classes, config.label_smoothing, config.l2_weight_decay)
    # The host batches' shape: (global batch, image size).
    self.shape = (config.global_batch_size, config.image_size)
    self.step = programs.train_step(
        self.model, self.optimizer, self.objective, strategy, self.ema,
        accumulation=config.gradient_accumulation_steps)

  def state(self):
    return programs.initial_state(
        self.model, self.optimizer, self.strategy, np.int32(0),
        [v.value for v in moving_average.averaged(self.model)]
        if self.ema else None)


class Probe:
  """The stages over one set of host batches, the figures so far in
  `results`, saved by `save` after each."""

  def __init__(self, config, num_classes, steps_per_execution, executions,
               budget_s, save, out_dir=None):
    self.config, self.num_classes = config, num_classes
    self.slots, self.executions = steps_per_execution, executions
    self.start, self.budget_s, self.save = time.perf_counter(), budget_s, save
    self.out_dir = out_dir  # Where (g) leaves its trace; None: nowhere.
    self.strategy = mesh.DataParallel(jax.devices())
    self.device = jax.devices()[0]
    self._host_batches = {}
    self.host_batches = self.batches_of(
        (config.global_batch_size, config.image_size))
    self.results = {'machine': machine(self.device),
                    'config': {key: config[key] for key in (
                        'model', 'image_size', 'global_batch_size',
                        'batch_norm', 'squeeze_excite', 'depthwise',
                        'ema_decay', 'optimizer')},
                    'stages': {}}
    self.compile_s = None  # (a)'s, what later stages are predicted by.
    # The saved autotune picks XLA loaded (picks.load), and
    # whether (a) writes its compiled step's text.
    self.loaded_picks, self.keep_hlo = None, False
    self.device_images_per_sec = None  # (a)'s.
    self.setups = {}

  def left_s(self):
    return self.budget_s - (time.perf_counter() - self.start)

  def setup(self, policy):
    if policy not in self.setups:
      self.setups[policy] = Setup(self.config, self.num_classes, policy,
                                  self.strategy)
    return self.setups[policy]

  def batches_of(self, shape):
    """A few distinct host batches of `shape` (global batch, image size),
    cycled: the host's cost is the copy."""
    key = shape
    if key not in self._host_batches:
      rng = np.random.default_rng(0)
      batch, size = key
      self._host_batches[key] = [
          (rng.integers(0, 256, (batch, size, size, 3), np.uint8),
           rng.integers(0, self.num_classes, (batch,), np.int32))
          for _ in range(4)]
    return self._host_batches[key]

  def on_devices(self, steps, shape=None):
    """`steps` batches of `shape` (a Setup's; the probe's own if None) on
    the devices."""
    batches = (self.batches_of(shape) if shape else self.host_batches)
    return [self.strategy.to_devices(batches[i % 4]) for i in range(steps)]

  def host_stream(self):
    while True:
      yield from self.host_batches

  def images(self, executions, slots=None, batch=None):
    return (executions * (slots or self.slots) *
            (batch or self.config.global_batch_size))

  def run(self, stages, policy, variants=(), measured_apart=None):
    """Runs `stages` (letters of STAGES) in order, (a) first whatever they
    say (the others read its program and rate), then the in-process
    `variants` (probe_variants.Variant); `measured_apart`: {name: figures}
    of variants measured in their own processes, set against (a). Returns
    the results."""
    for letter in 'a' + stages.replace('a', ''):
      name, stage, compiles = _STAGES[letter]
      self._record('stages', f'{letter}_{name}', compiles,
                   lambda stage=stage: stage(self, policy),
                   first=letter == 'a')
      if letter == 'a' and measured_apart:
        for name, figures in measured_apart.items():
          self._record('variants', name, 0, lambda figures=figures:
                       probe_variants.against(figures,
                                              self.device_images_per_sec))
    for variant in variants:
      self._record('variants', variant.name, 1, lambda variant=variant:
                   probe_variants.measure(self, Setup, self.setup(policy),
                                          variant, 'g' in stages))
    return self.results

  def record_repeats(self, fresh):
    """The spread of (a) over this process and the `fresh` ones
    (repeats.in_fresh_processes), and which program the other stages
    timed: this process's."""
    stages = self.results['stages']
    this = dict(stages.get('a_device_rate', {}))
    if 'g_profile' in stages:
      this['profile'] = stages['g_profile']
    processes = [('this process', this, self.out_dir or ''), *fresh]
    spread = repeats_lib.summarize(processes)
    spread['fastest_near_median'] = picks_lib.fastest_near_median(
        processes)
    if 'median_images_per_sec' in spread and self.device_images_per_sec:
      spread['other_stages_used'] = (
          f"this process's program: {self.device_images_per_sec:,.1f} "
          f'img/s, {self.device_images_per_sec / spread["median_images_per_sec"]:.3f}'
          ' of the median')
    self.results['repeats'] = spread
    self.save(self.results, 'repeats')

  def _record(self, section, name, compiles, measure, first=False):
    """Runs `measure` unless it would outlast the budget (predicted from
    (a)'s compile time), records its figures under `section` and saves."""
    needs_s = (self.compile_s or 60.0) * compiles * 1.5
    if not first and self.left_s() < needs_s:
      figures = {'skipped': f'{self.left_s():.0f} s of the budget left; '
                            f'it needs about {needs_s:.0f} s'}
    else:
      began = time.perf_counter()
      try:
        figures = measure()
      except Exception as e:  # pylint: disable=broad-except
        figures = {'failed': f'{type(e).__name__}: {str(e)[:400]}'}
      figures['seconds'] = round(time.perf_counter() - began, 1)
    self.results.setdefault(section, {})[name] = figures
    self.results['elapsed_s'] = round(time.perf_counter() - self.start, 1)
    self.save(self.results, section, name)


def save_policy(results):
  """Keeps the faster of (a)'s and (e)'s policies for this GPU model and
  JAX version (rules/speed/saved_policy.py), where `auto` on the JAX route
  then reads it; returns what it did, in a line."""
  machine_, stages = results['machine'], results['stages']
  rows = [{'policy': stages[stage].get('policy', policy), 'xla': 'on',
           'images_per_sec': stages[stage]['images_per_sec']}
          for stage, policy in (('a_device_rate', None),
                                ('e_float16', 'mixed_float16'))
          if 'images_per_sec' in stages.get(stage, {})]
  if machine_['platform'] != 'gpu' or len(rows) < 2:
    return ('no policy saved: --save_policy needs a GPU and stages a and e '
            'measured')
  fastest = max(rows, key=lambda row: row['images_per_sec'])
  config = results['config']
  target = saved_policy.save(
      {'fastest': fastest, 'rows': rows, 'model': config['model'],
       'image_size': config['image_size'],
       'global_batch_size': config['global_batch_size'],
       'time': time.strftime('%Y-%m-%d %H:%M:%S')},
      machine_['device_kind'], JaxBackend().software())
  return f'saved {fastest["policy"]} as the policy for this GPU in {target}'


def save_rate(results, config):
  """Keeps stage (a)'s rate (the median over --repeats processes) for this
  card, JAX version and step (rules/speed/saved_rate.py), which a run of
  the same step on the JAX route is then held to; returns what it did, in
  a line."""
  machine_, stages = results['machine'], results['stages']
  spread = results.get('repeats', {})
  rate = spread.get('median_images_per_sec') or stages.get(
      'a_device_rate', {}).get('images_per_sec')
  if not rate:
    return 'no rate saved: stage a was not timed'
  processes = len(spread.get('processes', {})) or 1
  card = (machine_['device_kind'] if machine_['platform'] == 'gpu'
          else machine_['platform'].upper())
  key = saved_rate.step_key(config, config.image_size, machine_['devices'],
                            stages['a_device_rate']['policy'])
  target = saved_rate.save(
      card, JaxBackend().software(), key, rate,
      f'launch.probe (stage a, median of {processes} processes, '
      f'{time.strftime("%Y-%m-%d")})' if processes > 1 else
      f'launch.probe (stage a, one process, {time.strftime("%Y-%m-%d")})')
  return f'saved {rate:,.1f} img/s as the rate of this step on {card} in {target}'


def machine(device):
  """What ran the probe, as JAX and Keras see it."""
  stats = device.memory_stats() or {}
  return {'platform': device.platform, 'device_kind': device.device_kind,
          'devices': jax.device_count(), 'hosts': jax.process_count(),
          'jax_version': jax.__version__, 'keras_version': keras.__version__,
          'memory_limit_bytes': stats.get('bytes_limit'),
          'compute_capability': getattr(device, 'compute_capability', None)}


# letter: (name, stage, compilations it makes).
_STAGES = probe_stages.BY_LETTER
