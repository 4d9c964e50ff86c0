"""What the input pipelines take of a run's config, read once: the one part
inputs.py, cache.py and decode.py are given (dali/ too, beside the files
its config names), so they read no config, and the plan prints what they
use. Its values are the config's (configs/default.py has the defaults).

Imports no TensorFlow.
"""

import dataclasses

from pipeline.data import augmentations
from pipeline.errors import UserError

# What users type for "no cache", as --config.augment=none means off.
CACHE_OFF = ('none', 'off', 'no', 'false')
MEMORY = 'memory'  # The setting that holds the cache in RAM; '' none.


def cache_setting(value):
  """config.cache as the input reads it: 'memory', '' (off) or a file
  prefix that is plainly a path; the words for off become ''. A bare word
  would have been a file cache named after it, written into the current
  folder ('none-train-0.*'): a one-line UserError."""
  if value.lower() in CACHE_OFF:
    return ''
  if value not in ('', MEMORY) and not (
      '/' in value or value.startswith(('~', '.'))):
    raise UserError(f"cache={value!r} is neither 'memory', '' or none (off), "
                    'nor a path: a file cache is a path prefix, e.g. '
                    f'./{value} or /tmp/cache/{value}')
  return value


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """How examples become batches: their size (training's, evaluation's),
  the training transform and batch-level blends, the shuffle, the cache
  and a tf.data service."""
  image_size: int
  eval_image_size: int
  augmentation: augmentations.Augmentation
  randaugment: augmentations.RandAugment  # Where the augmentation has it.
  mixup_alpha: float
  cutmix_alpha: float
  shuffle_buffer: int
  # True repeats the order (and crops) of a seed, at some speed.
  deterministic: bool
  seed: int  # Also seeds the blends, which repeat either way.
  # config.cache: '' (none), 'memory', a local or gs:// file prefix.
  cache: str
  data_service: str  # grpc://HOST:PORT of a dispatcher, or '' (here).
  # Labels as blends' soft targets: where mixup or CutMix is on (in any
  # stage of progressive learning, even one whose alpha is 0).
  soft_labels: bool
  # Progressive learning: the input rebuilt at each stage's size and
  # strengths (at_stage).
  staged: bool

  @classmethod
  def of(cls, config, image_size=None, eval_image_size=None, augment=None,
         staged=None):
    """The spec of `config` with the run's resolved values (the plan's:
    its sizes, its augmentation's name, whether it trains in stages);
    each left None is the config's own, which must then be given (a
    tool's or a test's config that names its sizes)."""
    image_size = image_size or config.image_size
    augment = augment or config.augment
    if not image_size or not augment:
      raise ValueError('image_size and augment must be resolved (the plan '
                       'resolves what a config leaves open)')
    return cls(image_size,
               eval_image_size or config.eval_image_size or image_size,
               augmentations.AUGMENTATIONS[augment],
               augmentations.RandAugment(config.randaugment_layers,
                                         config.randaugment_magnitude),
               config.mixup_alpha, config.cutmix_alpha,
               config.shuffle_buffer, config.deterministic_input,
               config.seed, cache_setting(config.cache), config.data_service,
               bool(config.mixup_alpha or config.cutmix_alpha),
               bool(config.progressive_stages) if staged is None else staged)

  def at_stage(self, image_size, randaugment_magnitude, mixup_alpha):
    """This spec at one stage of progressive learning: its size, its
    RandAugment's magnitude and mixup; the labels stay soft through every
    stage where any mixes. A file cache holds each size apart."""
    return dataclasses.replace(
        self, image_size=image_size, mixup_alpha=mixup_alpha,
        randaugment=dataclasses.replace(self.randaugment,
                                        magnitude=randaugment_magnitude),
        cache=(f'{self.cache}-{image_size}px'
               if self.cache not in ('', MEMORY) else self.cache))

  @property
  def shuffle_seed(self):
    """The shuffle's and crops' seed: None (fresh each run) unless
    deterministic."""
    return self.seed if self.deterministic else None

  @property
  def mixes(self):
    return self.soft_labels

  @property
  def central_fraction(self):
    """Of each side, what evaluation crops to, centred."""
    return self.augmentation.central_fraction

  @property
  def cache_size(self):
    """The shorter side of what a decoded cache holds for training."""
    return int(round(self.image_size / self.central_fraction))

  def describe(self, why=''):
    """The plan's words for it: the transform (and `why` it is that one),
    the blends, the service."""
    mixes = [f'{name} {alpha:g}' for name, alpha in
             (('mixup', self.mixup_alpha), ('cutmix', self.cutmix_alpha))
             if alpha]
    randaugment = self.randaugment
    return (f'augment {self.augmentation.name}'
            + (f' ({randaugment.layers} operations of magnitude '
               f'{randaugment.magnitude:g})' if self.augmentation.randaugment
               else '')
            + (f' ({why})' if why else '')
            + (f'; {" or ".join(mixes)} per batch (training accuracy is '
               'against the dominant label)' if mixes else '')
            + (f'; training input from tf.data service {self.data_service} '
               '(sharding OFF: each worker streams the whole set)'
               if self.data_service else ''))
