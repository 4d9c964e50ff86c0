"""How fast the input is, how fast the model could go, and how fast it goes.

Three throughputs for one config, so a slow run can be blamed on the right
part: the tf.data pipeline alone (first pass with the cache cold, then warm),
training on one synthetic batch already on the device (the model's ceiling),
and training on the real input. Compile time is timed apart, never mixed into
a throughput.
"""

import time

import numpy as np
import tensorflow as tf
from absl import logging

from pipeline import data
from pipeline import trainer as trainer_lib


def input_throughput(config, source, global_batch_size, max_batches):
  """Images/s of the whole pipeline on the host: (cold, warm) passes."""
  counter = data.SkipCounter()
  dataset = data.train_input_fn(config, source, global_batch_size, counter)(
      tf.distribute.InputContext(1, 0, 1))
  batches_per_pass = min(source.num_train_examples // global_batch_size,
                         max_batches)
  iterator = iter(dataset)
  rates = []
  # The first pass decodes and fills the cache; later ones read from it.
  for _ in range(2):
    start = time.perf_counter()
    for _ in range(batches_per_pass):
      next(iterator)
    rates.append(batches_per_pass * global_batch_size /
                 (time.perf_counter() - start))
  return rates[0], rates[1]


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


def run(config, plan, executions):
  """Measures the three throughputs; returns the figures as a dict."""
  strategy = plan.hardware.strategy
  source = plan.source
  batch = plan.global_batch_size
  spe = plan.steps_per_execution
  images_per_execution = batch * spe * executions
  logging.info('Input alone: two passes of up to %d batches of %d',
               executions * spe, batch)
  cold, warm = input_throughput(config, source, batch, executions * spe)

  trainer = trainer_lib.build(config, plan)
  size = config.image_size
  rng = np.random.RandomState(0)
  images = rng.randint(0, 256, (batch, size, size, 3)).astype(np.uint8)
  labels = rng.randint(0, source.num_classes, batch).astype(np.int32)

  def synthetic(input_context):
    per_replica = input_context.get_per_replica_batch_size(batch)
    one = tf.data.Dataset.from_tensors((images[:per_replica],
                                        labels[:per_replica]))
    return one.cache().repeat()

  logging.info('Training on a synthetic batch: %d executions', executions)
  synthetic_iterator = iter(strategy.distribute_datasets_from_function(synthetic))
  compile_s, seconds, synthetic_wait = _timed_executions(
      trainer, synthetic_iterator, spe, executions)
  synthetic_rate = images_per_execution / seconds

  logging.info('Training on the real input: %d executions', executions)
  real_iterator = iter(strategy.distribute_datasets_from_function(
      data.train_input_fn(config, source, batch, data.SkipCounter())))
  _, seconds, real_wait = _timed_executions(trainer, real_iterator, spe,
                                            executions)
  real_rate = images_per_execution / seconds
  return {
      'model': config.model,
      'dataset': source.name,
      'image_size': size,
      'global_batch_size': batch,
      'steps_per_execution': spe,
      'policy': plan.policy,
      'strategy': plan.hardware.strategy_name,
      'num_replicas': plan.hardware.num_replicas,
      'xla': plan.xla,
      'cache': config.cache,
      'augment': config.augment,
      'input_cold_images_per_sec': cold,
      'input_warm_images_per_sec': warm,
      'train_synthetic_images_per_sec': synthetic_rate,
      'train_synthetic_input_wait_fraction': synthetic_wait,
      'train_real_images_per_sec': real_rate,
      'train_real_input_wait_fraction': real_wait,
      'input_headroom': warm / synthetic_rate,
      'compile_s': compile_s,
  }


def table(result):
  """A small text table of the benchmark's figures."""
  rows = [
      ('input alone, cold cache', result['input_cold_images_per_sec'], None),
      ('input alone, warm cache', result['input_warm_images_per_sec'], None),
      ('train, synthetic on device', result['train_synthetic_images_per_sec'],
       result['train_synthetic_input_wait_fraction']),
      ('train, real input', result['train_real_images_per_sec'],
       result['train_real_input_wait_fraction']),
  ]
  lines = [f'{result["model"]} at {result["image_size"]} px, batch '
           f'{result["global_batch_size"]}, {result["policy"]}, '
           f'{result["strategy"]} x{result["num_replicas"]}',
           f'{"what":<28} {"images/s":>10} {"input wait":>11}']
  for name, rate, wait in rows:
    lines.append(f'{name:<28} {rate:>10.1f} '
                 f'{"" if wait is None else f"{wait:.1%}":>11}')
  lines.append(f'compile (first call): {result["compile_s"]:.1f} s; warm input '
               f'/ model ceiling: {result["input_headroom"]:.1f}x')
  return '\n'.join(lines)
