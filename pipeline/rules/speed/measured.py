"""The faster backend on this GPU model, as the user measured it.

`launch.benchmark --backends=tensorflow,jax --save_policy` trains the same
model on both backends, one after the other on the same card, and keeps the
faster on a synthetic batch (the model's speed, not the input's), with the
policy it ran under, per GPU model and the software of both backends.
`--backend=auto` then takes that backend on the same GPU model and
software, and the policy there; another GPU or software ignores the record.
Imports no TensorFlow, JAX or Keras.
"""

import logging

from pipeline.storage import user_cache

RATE = 'train_synthetic_images_per_sec'


def path(gpu_name, software):
  return user_cache.folder('backend', user_cache.slug(gpu_name),
                           f'{user_cache.slug(software)}.json')


def save(comparison, gpu_name, software):
  """Keeps the faster backend of `comparison` (benchmark.across_backends'
  result) for this GPU and software; returns (its record, the file)."""
  rows = dict(comparison['backends'])
  fastest = max(rows, key=lambda name: rows[name][RATE])
  record = {'backend': fastest, 'policy': rows[fastest]['policy'],
            'images_per_sec': {name: rows[name][RATE] for name in rows},
            'gpu': gpu_name, 'software': software,
            'model': rows[fastest]['model'],
            'image_size': rows[fastest]['image_size'],
            'global_batch_size': rows[fastest]['global_batch_size']}
  target = path(gpu_name, software)
  user_cache.write_json(target, record)
  return record, target


def load(gpu_name, software):
  """The record saved for this GPU and software, or None. An unreadable
  file is passed over with one warning line."""
  source = path(gpu_name, software)
  try:
    record = user_cache.read_json(source)
    if record is None:
      return None
    rates = ', '.join(f'{name} {float(rate):,.0f}' for name, rate in
                      sorted(record['images_per_sec'].items()))
    record['reason'] = (
        f'your measurement saved for this GPU and software: {rates} img/s '
        f'({record["model"]} {record["image_size"]} px, batch '
        f'{record["global_batch_size"]}, {record["policy"]})')
    if not isinstance(record['backend'], str):
      raise TypeError(f'backend {record["backend"]!r}')
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    logging.warning('saved backend choice %s is unreadable (%s); using the '
                    'rule; launch.benchmark --backends=tensorflow,jax '
                    '--save_policy writes it again', source, e)
    return None
  return record
