"""Progressive learning (EfficientNetV2, Tan and Le 2021, Algorithm 1): the
run in stages, each at a larger image size with stronger regularisation.

`progressive_stages` N (0: off) splits the run's epochs into N stages; stage
i of N trains at the sizes and strengths interpolated i/(N-1) of the way
from the first stage's values to the run's own (image_size,
randaugment_magnitude, mixup_alpha, dropout_rate): small images early,
when the network learns coarse features cheaply and needs little
regularisation, the full size and the full regularisation last. The
first stage's values are keys of their own; left at their defaults they
are the paper's for EfficientNetV2 (Table 6: 128 px, RandAugment magnitude
5, no mixup, dropout 0.1) and, for other networks, half the size and a
third of the magnitude.

A stage ends on an epoch's boundary, so rebuilding the input there loses
no epoch's place; the step a run is at names its stage, so a resumed run
goes on at its stage's size. Each size is a compiled program of its own:
the model takes any size (models.model_of_config), and the backends trace
again for a new input shape, once per size.
"""

import dataclasses

from pipeline.errors import UserError

# What a first-stage key's default means: the network's own (below).
FAMILY = -1
# The sizes a stage takes: multiples of 16, so every stride-2 stage of the
# networks but the last halves a whole number of pixels. The networks take
# 32 px and more.
SIZE_STEP, SMALLEST = 16, 32


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage: its steps [first_step, end_step), and what it trains at."""
  index: int
  first_step: int
  end_step: int
  image_size: int
  randaugment_magnitude: float
  mixup_alpha: float
  dropout_rate: float
  # The stage's training input (a data.input_spec.InputSpec at its size
  # and strengths: stages()), handed down as it is.
  input: object = None

  def describe(self, count, randaugment):
    """The plan's line; `randaugment`: the run's augmentation has
    RandAugment (its magnitude is named only then)."""
    span = (f'steps {self.first_step}-{self.end_step}' if self.end_step
            else 'steps known once the data are')  # An unprepared set's.
    return (f'stage {self.index + 1}/{count}: {span}, {self.image_size} px, '
            + (f'RandAugment magnitude {self.randaugment_magnitude:g}, '
               if randaugment else '')
            + f'mixup {self.mixup_alpha:g}, dropout {self.dropout_rate:g}')

  def to_json(self):
    return {field.name: getattr(self, field.name)
            for field in dataclasses.fields(self) if field.name != 'input'}


@dataclasses.dataclass(frozen=True)
class Progression:
  """What a run asks of progressive learning: its stage count (0: off), its
  epochs, and the first and last stages' values (image_size,
  randaugment_magnitude, mixup_alpha, dropout_rate)."""
  count: int
  epochs: int
  first: dict
  last: dict

  @classmethod
  def of(cls, config, count, image_size, recipe_first=None, own_size=0):
    """The config's, at `count` stages (resolved: stage_count) ending at
    the run's resolved `image_size`: the first stage's values each key's,
    or (left at FAMILY; the size at 0 too) the network's recipe's
    (`recipe_first`: ModelFamily.progressive_first, for its own size
    `own_size`), its size scaled as the run's is from the network's own
    (V2-S's 128 of 300 px is 32 of a 64 px run); else half the size."""
    last = {'image_size': image_size,
            'randaugment_magnitude': config.randaugment_magnitude,
            'mixup_alpha': config.mixup_alpha,
            'dropout_rate': config.dropout_rate}
    own = dict(recipe_first) if recipe_first else None
    if own:
      own['image_size'] = max(SMALLEST, _on_step(
          own['image_size'] * image_size / own_size))
    else:
      own = {'image_size': max(SMALLEST, _on_step(image_size // 2)),
             'randaugment_magnitude': config.randaugment_magnitude / 3,
             'mixup_alpha': 0.0, 'dropout_rate': config.dropout_rate / 2}
    given = {'image_size': config.progressive_first_image_size or FAMILY,
             'randaugment_magnitude':
                 config.progressive_first_randaugment_magnitude,
             'mixup_alpha': config.progressive_first_mixup_alpha,
             'dropout_rate': config.progressive_first_dropout_rate}
    return cls(count, config.epochs,
               {name: own[name] if value == FAMILY else value
                for name, value in given.items()}, last)


def _on_step(size):
  return int(round(size / SIZE_STEP)) * SIZE_STEP


def stage_count(requested, recipe_count):
  """The run's stage count: progressive_stages `requested`, where -1
  takes the network's recipe's `recipe_count` (4 for EfficientNetV2, 0
  for the others)."""
  return recipe_count if requested == FAMILY else requested


def check(progression):
  """A one-line UserError for a stage count the epochs cannot hold, or a
  first stage the network cannot take or that does not grow; None where
  progressive learning is off or can run."""
  count, epochs = progression.count, progression.epochs
  if not count:
    return
  if not (isinstance(count, int) and 2 <= count <= epochs):
    raise UserError(f'progressive_stages={count!r}: expected 0 (off), -1 '
                    "(the network's recipe) or 2 to the run's "
                    f'{epochs} epochs (a stage is whole epochs)')
  first, last = (progression.first['image_size'],
                 progression.last['image_size'])
  if not SMALLEST <= first < last:
    raise UserError(
        f"progressive learning's first size {first} px must be at least "
        f'{SMALLEST} px and below the training size, {last} px: '
        'set --config.progressive_first_image_size, or a larger image_size')
  sizes = [stage.image_size for stage in stages(progression, 1)]
  if len(set(sizes)) != len(sizes):
    raise UserError(f'progressive learning from {first} to '
                    f'{last} px in {count} stages repeats a '
                    f'size ({", ".join(map(str, sizes))}; they step by '
                    f'{SIZE_STEP} px): fewer stages, or a smaller first size')


def stages(progression, steps_per_epoch, spec=None):
  """The run's Stages, in order: one, the whole run, where progressive
  learning is off (check() has passed it); each with its input, `spec`
  (the run's InputSpec) at its values."""
  count, epochs = progression.count, progression.epochs
  first, last = progression.first, progression.last
  if not count:
    return (Stage(0, 0, epochs * steps_per_epoch, **last, input=spec),)
  found = []
  for index in range(count):
    share = index / (count - 1)
    values = {name: first[name] + (last[name] - first[name]) * share
              for name in last}
    values['image_size'] = (last['image_size'] if index == count - 1 else
                            _on_step(values['image_size']))
    # Whole epochs a stage: the input is rebuilt where an epoch begins.
    begin, end = (epochs * part // count * steps_per_epoch
                  for part in (index, index + 1))
    staged = spec and spec.at_stage(values['image_size'],
                                    values['randaugment_magnitude'],
                                    values['mixup_alpha'])
    found.append(Stage(index, begin, end, **values, input=staged))
  return tuple(found)


def stage_at(all_stages, step):
  """The Stage that trains `step` (the last from its end on)."""
  return next((stage for stage in all_stages if step < stage.end_step),
              all_stages[-1])
