"""The step's rate launch.probe measured on this card, which a run is held to.

XLA picks kernels per process as it compiles (its autotuner times
candidates there), and the compile cache keeps what it picked; one process
in six on an H200 drew a depthwise convolution 3.8x slower than the rest,
the whole step 30% slower, and said nothing. `launch.probe --save_rate`
keeps stage (a)'s rate (the median over --repeats processes) per card,
software and step (model, size, batch, devices, policy, layer forms); a
run with the same step then says, in its progress lines, when its own
step runs more than SLOW below it. Imports no TensorFlow, JAX or Keras.
"""

import logging

from pipeline.storage import user_cache

# A run's step this far below the saved rate is worth a line.
SLOW = 0.10


def step_key(config, image_size, devices, policy):
  """What makes two steps the same program: the network and its layer
  forms, the image size (the run's, resolved), the batch and its split,
  the policy."""
  return (f'{config.model}-{image_size}px-batch'
          f'{config.global_batch_size}-{devices}dev-{policy}-'
          f'{config.batch_norm}-{config.squeeze_excite}-{config.depthwise}')


def path(card, software, key):
  return user_cache.folder('rate', user_cache.slug(card),
                           user_cache.slug(software),
                           f'{user_cache.slug(key)}.json')


def save(card, software, key, images_per_sec, measured_by):
  """Keeps the rate measured for this card, software and step; returns
  the file's path."""
  target = path(card, software, key)
  user_cache.write_json(target, {
      'images_per_sec': images_per_sec, 'card': card, 'software': software,
      'step': key, 'measured_by': measured_by})
  return target


def load(card, software, key):
  """(images/s, where it comes from) saved for this card, software and
  step, or None. An unreadable file is passed over with one warning."""
  source = path(card, software, key)
  try:
    record = user_cache.read_json(source)
    if record is None:
      return None
    return float(record['images_per_sec']), (
        f"{record['measured_by']} on this card and software ({source})")
  except (OSError, ValueError, KeyError, TypeError) as e:
    logging.warning('saved rate %s is unreadable (%s); launch.probe '
                    '--save_rate writes it again', source, e)
    return None


def slow_step_line(step_images_per_sec, saved, compile_cache_dir):
  """The warning for a step more than SLOW below the `saved` rate (load's
  pair), or None where it is not."""
  rate, source = saved
  if step_images_per_sec >= (1 - SLOW) * rate:
    return None
  return (f'Slow step: {step_images_per_sec:,.0f} img/s (input waits left '
          f'out), {step_images_per_sec / rate:.2f} of the {rate:,.0f} img/s '
          f'measured by {source}. XLA picks kernels per process as it '
          'compiles; keep a fast process\'s picks with `python -m '
          'launch.probe --repeats=3 --save_autotune` (the fastest within 2% '
          'of the median), and every later run on this card loads them and '
          'runs the same kernels'
          + (f' (programs compiled under the old picks in '
             f'{compile_cache_dir} are not served: its folder names the '
             'picks); the run resumes' if compile_cache_dir else ''))
