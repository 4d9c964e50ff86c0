"""What the input caches, and the cache itself.

choose() picks, from the InputSpec's cache (config.cache, the setting: a
place) and the sizes, the Kind it holds: decoded images (where they fit in
half the free RAM, or in a file cache), else the encoded records, else a
one-line refusal. apply() puts the cache in a pipeline and clears the lock
a killed run left on a file cache.
"""

import enum
import os

from absl import logging
import tensorflow as tf

from pipeline.data import input_spec
from pipeline.storage import gcs
from pipeline.storage import workdirs
from pipeline.errors import UserError


MEMORY = input_spec.MEMORY


def written_paths(setting):
  """{'cache': prefix} where the setting names a file cache, which the
  input's workers write; {} for the cache in RAM or none."""
  return {} if setting in (MEMORY, '') else {'cache': setting}


def available_memory_bytes():
  """MemAvailable (free plus reclaimable page cache), else free pages."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


class Kind(enum.Enum):
  """What the cache holds, and so where in the pipeline it sits."""
  NONE = 'none'
  DECODED = 'decoded'  # Images, augmented after the cache each epoch.
  ENCODED = 'encoded'  # The records, decoded and cropped each epoch.

  def __str__(self):
    return self.value


def choose(spec, source, available_bytes=None):
  """What `spec.cache` caches (`spec`: an InputSpec): (Kind, why).

  'memory' holds the decoded images where they fit in half the free RAM,
  else the encoded records (decoded and cropped again each epoch: about the
  cost of no cache, without the reads), else refuses in one line. A file
  prefix holds decoded images on disk; its folder must be writable.
  """
  setting = spec.cache
  if not setting:
    return Kind.NONE, "cache=''"
  if gcs.is_gcs(setting):  # A TPU Node's, which its workers write.
    return Kind.DECODED, f'cache={setting!r}, on the TPU workers'
  if setting != MEMORY:
    try:
      workdirs.check_writable(os.path.dirname(os.path.abspath(setting)),
                             what=f'cache={setting!r}: folder')
    except UserError as e:
      raise UserError(f"{e}; use a writable path prefix, 'memory' or '' "
                      '(no cache)') from None
    return Kind.DECODED, f'file cache {setting}-*'
  size, examples = spec.cache_size, (source.num_train_examples +
                                     source.num_eval_examples)
  # A decoded cache keeps each training image's aspect (about 4:3) for
  # random crops; evaluation's images are final.
  aspect = spec.augmentation.cached_aspect
  decoded = 3 * (source.num_train_examples * size**2 * aspect +
                 source.num_eval_examples * spec.image_size**2)
  available = available_bytes or available_memory_bytes()
  gib = lambda n: f'{n / 2**30:.1f} GiB'
  if decoded <= available // 2:
    return Kind.DECODED, (f'decoded images, {gib(decoded)}, fit in half the '
                       f'{gib(available)} free')
  if source.encoded_bytes and source.encoded_bytes <= available // 2:
    return Kind.ENCODED, (
        f'decoded images would take {gib(decoded)}, more than half the '
        f'{gib(available)} free; the encoded records, '
        f'{gib(source.encoded_bytes)}, fit: decoded and cropped each epoch')
  raise UserError(
      f'cache=memory needs about {gib(decoded)} for {examples} decoded '
      f'images at {size} px'
      + (f' ({gib(source.encoded_bytes)} encoded)'
         if source.encoded_bytes else '') +
      f', more than half the {gib(available)} free; use '
      "--config.cache=/local/path/prefix (a file cache) or --config.cache=''")


def apply(dataset, spec, split, input_context):
  """`dataset` cached as the InputSpec `spec` says."""
  if spec.cache == MEMORY:
    return dataset.cache()
  if spec.cache:
    # One file cache per split and input pipeline; each holds its own shard.
    prefix = f'{spec.cache}-{split}-{input_context.input_pipeline_id}'
    remove_stale_lock(prefix)
    return dataset.cache(prefix)
  return dataset


def remove_stale_lock(prefix):
  """Removes what a run stopped mid-way through writing a file cache left.

  tf.data writes the cache in the first pass under a lock file and renames
  it into place at the end; a run killed before that leaves the lock, and
  the next run would fail in its first step ("concurrent caching iterator
  running"). Only this run reads and writes its pipeline's prefix.
  """
  leftovers = (tf.io.gfile.glob(f'{prefix}*.lockfile') +
               tf.io.gfile.glob(f'{prefix}*.tempstate*'))
  for path in leftovers:
    logging.warning('Removing %s, left by a run that stopped while writing '
                    'its cache; the cache is written anew', path)
    tf.io.gfile.remove(path)
