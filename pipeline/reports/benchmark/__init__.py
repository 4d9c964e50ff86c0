"""How fast the input is, how fast the model could go, and how fast it goes.

Three throughputs for one config, so a slow run can be blamed on the right
part: the tf.data pipeline alone (first pass with the cache cold, then warm;
per core; beside tensorflow/tpu's reference preprocessing on the same files),
training on one synthetic batch already on the device (the model's ceiling),
and training on the real input. Compile time is timed apart, never mixed into
a throughput. The text tables of the results are tables.py's; a step's
time by kind of layer (--layer_times) is layer_times.py's.
"""

import dataclasses
import json
import math
import os
import statistics
import subprocess
import tempfile
import time

from absl import logging
import numpy as np
import tensorflow as tf

from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.data import inputs
from pipeline.run import plan as plan_lib
from pipeline.rules.machine import peaks
from pipeline.reports import reference_input
from pipeline.reports.benchmark import layer_times
from pipeline.errors import UserError
from pipeline.launchers import Launcher
from pipeline import launchers

_ROUNDS = 3  # Of ours against the reference.
# Trainer.step_cost's keys as the result names them.
_COST_KEYS = {'flops': 'flops_per_image', 'bytes': 'bytes_per_image',
              'counted': 'step_cost_counted', 'reason': 'step_cost_reason'}


def input_throughput(spec, source, global_batch_size, max_batches,
                     cache=None):
  """Images/s of the whole pipeline (prepared as the InputSpec `spec`
  says) on the host: (cold, warm) passes."""
  dataset = inputs.train_input_fn(spec, source, global_batch_size, cache)(
      tf.distribute.InputContext(1, 0, 1))
  batches_per_pass = min(source.num_train_examples // global_batch_size,
                         max_batches)
  # The first pass decodes and fills the cache; later ones read from it.
  return tuple(_rate(iter(dataset), batches_per_pass, global_batch_size)
               for _ in range(2))


def _rate(iterator, batches, batch_size):
  next(iterator)  # Started: threads up, buffers filling.
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * batch_size / (time.perf_counter() - start)


def available_cores():
  return len(os.sched_getaffinity(0))


def _timed_executions(trainer, iterator, steps_per_execution, executions):
  """Seconds of the first call (compile), then of `executions` timed calls,
  and the input wait fraction of those: (compile_s, seconds, fraction)."""
  start = time.perf_counter()
  trainer.train(iterator, steps_per_execution)
  compile_s = time.perf_counter() - start
  seconds = wait_s = 0.0
  for _ in range(executions):
    start = time.perf_counter()
    out = trainer.train(iterator, steps_per_execution)
    seconds += time.perf_counter() - start
    wait_s += out['input_wait_s']
  return compile_s, seconds, wait_s / seconds


def run(plan, executions, input_only=False, target_images_per_sec=0):
  """Measures the throughputs; returns the figures as a dict.

  The input alone always, with its rate per core, beside the reference
  preprocessing on the same files (TFRecord JPEGs) and against
  `target_images_per_sec` (what the accelerators consume); the model on a
  synthetic batch and on the real input unless `input_only`.
  """
  source, batch = plan.source, plan.global_batch_size
  spe = plan.steps_per_execution
  batches = executions * spe
  logging.info('Input alone: two passes of up to %d batches of %d', batches,
               batch)
  cold, warm = input_throughput(plan.input, source, batch, batches,
                                plan.cache_kind)
  cores = available_cores()
  result = {
      'model': plan.recipe.model, 'dataset': source.name,
      'image_size': plan.image_sizes.train, 'global_batch_size': batch,
      'steps_per_execution': spe, 'policy': plan.policy,
      'backend': plan.backend.name, 'device_kind': plan.hardware.device_kind,
      'detail': plan.hardware.detail,
      'strategy': plan.hardware.strategy_name,
      'num_replicas': plan.hardware.num_replicas, 'xla': plan.xla,
      'cache': str(plan.cache_kind),
      'augment': plan.input.augmentation.name, 'cores': cores,
      'input_cold_images_per_sec': cold, 'input_warm_images_per_sec': warm,
      'input_images_per_sec_per_core': warm / cores,
  }
  if source.record_files:
    # Alternated, as neighbours on a shared machine change both alike.
    logging.info('Ours and the reference preprocessing (tensorflow/tpu) on '
                 'the same files, alternated %d times', _ROUNDS)
    files = list(source.record_files['train'])
    # DALI beside them where it is installed, decoding where training would.
    on_gpu = plan.hardware.device_kind == 'GPU'
    with_dali = dali.installed()
    dali_input = with_dali and dali.train_input(plan.input, source, batch,
                                                plan.staging_dir)
    ours, reference, dalis = zip(*[
        (input_throughput(plan.input, source, batch, batches,
                          plan.cache_kind)[1],
         _rate(iter(reference_input.dataset(
             files, plan.image_sizes.train, batch)), batches, batch),
         dali.throughput(dali_input, batches, on_gpu) if with_dali else 0.0)
        for _ in range(_ROUNDS)])
    result.update(
        input_rounds_images_per_sec=list(ours),
        reference_rounds_images_per_sec=list(reference),
        reference_input_images_per_sec=statistics.median(reference),
        input_vs_reference=statistics.median(
            o / r for o, r in zip(ours, reference)),
        pipelines_images_per_sec={str(input_pipeline_lib.Pipeline.TF_DATA):
                                  statistics.median(ours)})
    if with_dali:
      result['pipelines_images_per_sec'][str(input_pipeline_lib.Pipeline.DALI)] = (
          statistics.median(dalis))
      result.update(dali_rounds_images_per_sec=list(dalis),
                    dali_decodes_on='GPU' if on_gpu else 'CPU',
                    dali_vs_tf_data=statistics.median(
                        d / o for d, o in zip(dalis, ours)))
  if target_images_per_sec:
    result.update(target_images_per_sec=target_images_per_sec,
                  input_feeds_target=warm >= target_images_per_sec,
                  cores_for_target=math.ceil(
                      target_images_per_sec / (warm / cores)))
  if not input_only:
    result.update(_train_throughputs(plan, executions))
    result['input_headroom'] = warm / result['train_synthetic_images_per_sec']
  return result


def _train_throughputs(plan, executions):
  """Training on one synthetic batch on the device, then on the real input."""
  batch, spe = plan.global_batch_size, plan.steps_per_execution
  trainer = plan.backend.build_trainer(plan)
  compile_s, synthetic_rate, synthetic_wait = _synthetic_throughput(
      plan, trainer, executions)
  logging.info('Training on the real input: %d executions', executions)
  real_iterator = iter(plan.backend.distribute(plan.hardware,
                                               inputs.train_input(plan)))
  _, seconds, real_wait = _timed_executions(trainer, real_iterator, spe,
                                            executions)
  side_by_side = overlap(plan, trainer, executions, synthetic_rate)
  hardware = plan.hardware
  logging.info("The step's FLOPs and bytes per image (XLA's cost analysis)")
  cost = trainer.step_cost()
  return {
      **{_COST_KEYS[key]: value for key, value in cost.items()},
      **side_by_side,
      **peaks.fractions(cost, synthetic_rate,
                        hardware.gpu_name or hardware.detail,
                        hardware.num_replicas, plan.precision.sixteen_bit),
      'train_synthetic_images_per_sec': synthetic_rate,
      'train_synthetic_input_wait_fraction': synthetic_wait,
      'train_real_images_per_sec': batch * spe * executions / seconds,
      'train_real_input_wait_fraction': real_wait,
      'compile_s': compile_s,
  }


def _synthetic_batch(plan):
  """One random batch, this host's share of the global batch (numpy)."""
  share = plan.global_batch_size // plan.hardware.num_workers
  size = plan.image_sizes.train
  rng = np.random.RandomState(0)
  return (rng.randint(0, 256, (share, size, size, 3)).astype(np.uint8),
          rng.randint(0, plan.source.num_classes, share).astype(np.int32))


def _synthetic_throughput(plan, trainer, executions):
  """(compile_s, images/s, input wait) training on one random batch that is
  already on the device: the model's ceiling."""
  batch, spe = plan.global_batch_size, plan.steps_per_execution
  logging.info('Training on a synthetic batch: %d executions', executions)
  iterator = iter(plan.backend.repeated(plan.hardware,
                                        *_synthetic_batch(plan)))
  compile_s, seconds, wait = _timed_executions(trainer, iterator, spe,
                                               executions)
  return compile_s, batch * spe * executions / seconds, wait


def overlap(plan, trainer, executions, synthetic_rate):
  """Input and compute side by side: the synthetic batch handed over late,
  the input alone as slow as the model. A trainer whose input moves while
  the current execution runs takes about the larger of the two (wall /
  (input + model) near 0.5); one that waits takes their sum (near 1.0)."""
  batch, spe = plan.global_batch_size, plan.steps_per_execution
  delay_s = batch / synthetic_rate
  logging.info("Training on input slowed to the model's pace (%.0f ms a "
               'batch): %d executions', delay_s * 1e3, executions)
  iterator = iter(plan.backend.repeated(
      plan.hardware, *_synthetic_batch(plan), delay_s=delay_s))
  _, seconds, _ = _timed_executions(trainer, iterator, spe, executions)
  steps = executions * spe
  return {'slow_input_delay_s': delay_s,
          'train_slow_input_images_per_sec': batch * steps / seconds,
          'overlap_wall_vs_sum': seconds / (2 * steps * delay_s)}


def across_backends(names, args):
  """The benchmark of `args` on each Keras backend, one child process each
  (`python -m launch.benchmark --backend=NAME`), one after the other so
  they never share the cores; {'backends': [[name, result dict]...]}. A
  backend whose child fails gets {'failed': its last line} as its result:
  the other backends' figures stand."""
  results = []
  for name in names:
    with tempfile.TemporaryDirectory() as folder:
      output = os.path.join(folder, 'result.json')
      logging.info('Benchmarking on --backend=%s', name)
      child = subprocess.run(
          launchers.command(Launcher.BENCHMARK, f'--backend={name}',
                            f'--output={output}', *args), capture_output=True, text=True,
          check=False)
      if child.returncode:
        lines = (child.stderr.strip() or 'no output').splitlines()
        logging.warning('the benchmark on --backend=%s failed: %s', name,
                        lines[-1])
        results.append([name, {'failed': lines[-1]}])
        continue
      with open(output) as f:
        results.append([name, json.load(f)])
  return {'backends': results}


def failed_backends(comparison):
  """The backends of an across_backends result that have no figures."""
  return [name for name, r in comparison['backends'] if 'failed' in r]


def xla_settings(hardware):
  """(--xla value, why it is skipped or None) worth trying on `hardware`."""
  if hardware.device_kind == 'TPU':
    return [('on', None)]  # A TPU runs nothing but XLA programs.
  return [('off', None), ('on', None)]


def sweep(config, request, policies, xla=('off', 'on'), executions=3,
          hardware=None, profile_layers=False):
  """Trains a few executions on a synthetic batch for every valid (policy,
  XLA) pair: rows of images/s and compile time, or why a pair was skipped.

  For deciding on new hardware in minutes: no accuracy (launch.compare
  trains to accuracy). The hardware is found once (unless given), for all
  pairs. `profile_layers`: each pair's step also profiled for two
  executions, its time by kind of layer (layer_times.py).
  """
  hardware = hardware or plan_lib.find_hardware(request)
  rows, image_size = [], config.image_size
  for policy in policies:
    for setting, skip in xla_settings(hardware):
      if setting not in xla:
        continue
      row = {'policy': policy, 'xla': setting}
      rows.append(row)
      if skip:
        row['skipped'] = skip
        continue
      try:
        run_plan = plan_lib.resolve(
            config, dataclasses.replace(request, policy=policy, xla=setting),
            hardware)
      except UserError as e:
        row['skipped'] = str(e)
        continue
      image_size = run_plan.image_sizes.train
      trainer = run_plan.backend.build_trainer(run_plan)
      compile_s, rate, _ = _synthetic_throughput(run_plan, trainer,
                                                 executions)
      row.update(images_per_sec=rate, compile_s=compile_s)
      if profile_layers:
        logging.info('Profiling %s, XLA %s: its time by kind of layer',
                     policy, setting)
        row['layer_ms_per_step'] = layer_times.measure(
            trainer, iter(run_plan.backend.repeated(
                run_plan.hardware, *_synthetic_batch(run_plan))),
            run_plan.steps_per_execution, 2, run_plan.backend.profiler())
  measured = [r for r in rows if 'images_per_sec' in r]
  fastest = max(measured, key=lambda r: r['images_per_sec'], default=None)
  float32 = [r['images_per_sec'] for r in measured if r['policy'] == 'float32']
  return {
      'device_kind': hardware.device_kind, 'detail': hardware.detail,
      'gpu_name': hardware.gpu_name, 'time': time.strftime('%Y-%m-%d %H:%M'),
      'strategy': hardware.strategy_name,
      'replicas': hardware.num_replicas, 'model': config.model,
      'logical_gpus': request.split_gpus > 1,
      'image_size': image_size,
      'global_batch_size': config.global_batch_size, 'rows': rows,
      'fastest': fastest,
      'speedup_over_float32': (fastest['images_per_sec'] / max(float32)
                               if fastest and float32 else None),
  }
