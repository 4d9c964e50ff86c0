"""A policy measured on this GPU, or this CPU, wins over the rule.

`--policy=auto` on a GPU follows a rule of compute capability, on a CPU
float32 (precision.py). A user who measured their device with
`launch.benchmark --policies=... --save_policy` keeps the sweep's fastest
policy in their cache folder, keyed by the device (the GPU model, the CPU's
model name) and the software (TensorFlow and cuDNN versions), and on a CPU
also the network and its size (`step`: whether oneDNN's 16-bit kernels
win depends on the shapes); `auto` then takes it on the same device and
software, and the plan line says so with the figures. Another device or
software ignores it: the figures would not hold there.

A sweep over several replicas (several GPUs, or one split with
--split_gpus) also decides `--xla=auto` under MirroredStrategy on that GPU
model (load_xla): XLA there was never measured by this project.
"""

from absl import logging

from pipeline.storage import user_cache


def path(device, software, step=''):
  """The record of `device` and `software`; a CPU's per `step`
  (step_of's)."""
  if step:
    return user_cache.folder('policy', user_cache.slug(device),
                             user_cache.slug(software),
                             f'{user_cache.slug(step)}.json')
  return user_cache.folder('policy', user_cache.slug(device),
                           f'{user_cache.slug(software)}.json')


def step_of(model, image_size):
  """What a CPU's record is kept per: the network and its size."""
  return f'{model}-{image_size}px'


def save(sweep, gpu_name, software, step=''):
  """Keeps `sweep`'s (benchmark.sweep's result) fastest policy for this
  device (`gpu_name`: a GPU model or a CPU's model name) and software, a
  CPU's per `step`; returns the file's path."""
  fastest = sweep['fastest']
  others = {}
  for row in sweep['rows']:
    if 'images_per_sec' in row and row['policy'] != fastest['policy']:
      others[row['policy']] = max(others.get(row['policy'], 0),
                                  row['images_per_sec'])
  xla_rates = {}
  for row in sweep['rows']:
    if 'images_per_sec' in row:
      xla_rates.setdefault(row['policy'], {})[row['xla']] = (
          row['images_per_sec'])
  record = {'policy': fastest['policy'],
            'images_per_sec': fastest['images_per_sec'], 'others': others,
            'xla_images_per_sec': xla_rates,
            'replicas': sweep.get('replicas', 1),
            'logical_gpus': sweep.get('logical_gpus', False),
            'gpu': gpu_name, 'software': software,
            'model': sweep['model'], 'image_size': sweep['image_size'],
            'global_batch_size': sweep['global_batch_size'],
            'saved': sweep.get('time', '')}
  target = path(gpu_name, software, step)
  user_cache.write_json(target, record)
  return target


def load(gpu_name, software, step=''):
  """(policy, reason) saved for this device and software (a CPU's for
  `step`), or None. An unreadable file is passed over with one warning
  line."""
  source = path(gpu_name, software, step)
  try:
    record = user_cache.read_json(source)
    if record is None:
      return None
    policy, rate = record['policy'], float(record['images_per_sec'])
    others = ', '.join(f'{name} {value:,.0f}'
                       for name, value in sorted(record['others'].items()))
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    _unreadable(source, e)
    return None
  return policy, (
      f'your sweep saved for this {"CPU, network, size" if step else "GPU"} '
      f'and software: {rate:,.0f} img/s'
      + (f' against {others}' if others else '')
      + f' ({record.get("model")} {record.get("image_size")} px, batch '
      f'{record.get("global_batch_size")}; {source})')


def load_xla(gpu_name, software, policy):
  """(XLA on?, reason) from a sweep saved for this GPU and software over
  several replicas that ran `policy` with XLA on and off; None without one
  (an unreadable record: load's warning)."""
  source = path(gpu_name, software)
  try:
    record = user_cache.read_json(source)
    if record is None or int(record.get('replicas', 1)) < 2:
      return None
    rates = record.get('xla_images_per_sec', {}).get(policy, {})
    on, off = float(rates['on']), float(rates['off'])
  except KeyError:  # This policy not swept both ways.
    return None
  except (OSError, ValueError, TypeError, AttributeError) as e:
    _unreadable(source, e)
    return None
  # Logical GPUs of one card (--split_gpus) all-reduce without NCCL
  # (TensorFlow: "NCCL is not supported when using virtual GPUs").
  where = ('logical replicas of one GPU, without NCCL: a sweep over real '
           'GPUs replaces it' if record.get('logical_gpus') else 'replicas')
  return on > off, (
      f'your sweep saved for this GPU and software over '
      f'{record["replicas"]} {where} ({policy}): XLA on {on:,.0f} img/s, '
      f'off {off:,.0f} ({source})')


def _unreadable(source, error):
  logging.warning('saved policy %s is unreadable (%s); using the rule; '
                  'launch.benchmark --policies=... --save_policy writes it '
                  'again', source, error)
