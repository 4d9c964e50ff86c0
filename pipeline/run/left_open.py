"""What a config leaves open, the data and the network decide: the image
sizes (0: the network's own, capped by the data's detail), the
augmentation ('': the source's own), the stages of progressive learning
(-1: the network's recipe). The plan holds what was chosen and why; the
workdir's recipe holds the values (Resolved), never the words for open.
"""

import dataclasses

from pipeline.data import sources
from pipeline.recipe import models
from pipeline.recipe import progressive


@dataclasses.dataclass(frozen=True)
class Resolved:
  """The values chosen for the keys a config may leave open, as run.json's
  recipe compares them: a run whose data now choose another size is
  another recipe."""
  image_size: int
  eval_image_size: int
  augment: str
  progressive_stages: int

  def recorded(self, resolved):
    """These values as a run.json's `resolved` object has them (the plan's
    to_json); this Resolved's own where one from before a key was
    resolved holds none."""
    stages = resolved.get('progressive_stages')
    return Resolved(resolved.get('image_size') or self.image_size,
                    resolved.get('eval_image_size') or self.eval_image_size,
                    resolved.get('augment') or self.augment,
                    self.progressive_stages if stages is None else
                    len(stages))


@dataclasses.dataclass(frozen=True)
class Choices:
  """What a run chose for the keys its config left open, and why."""
  sizes: models.ImageSizes
  augment: str
  augment_reason: str
  progression: progressive.Progression
  # Why the network's recipe's stages are off, where they are; '' else.
  stages_off: str = ''

  @property
  def resolved(self):
    return Resolved(self.sizes.train, self.sizes.eval, self.augment,
                    self.progression.count)


def choose(config, source):
  """The Choices for `config` on its loaded `source`: the data's detail
  read (a sample of headers) only where the size is left open."""
  sizes = models.image_sizes(
      config.model, config.image_size, config.eval_image_size,
      None if config.image_size else source.detail())
  sizes.check_source(source.name, source.image_side)
  augment, reason = ((config.augment, 'set in the config') if config.augment
                     else sources.SOURCES.of(config).own_augment(
                         sources.SOURCES.settings(config)))
  family = models.MODELS[config.model]
  recipe_count = family.progressive_stages(config.model)
  progression = progressive.Progression.of(
      config, progressive.stage_count(config.progressive_stages, recipe_count),
      sizes.train, family.progressive_first(config.model),
      family.image_sizes(config.model)[0])
  stages_off = ''
  if (config.progressive_stages == progressive.FAMILY and recipe_count and
      progression.first['image_size'] >= sizes.train):
    # Left to the recipe, at a size the data chose: no smaller first stage.
    stages_off = (f"{config.model}'s recipe trains in {recipe_count} stages "
                  f'growing to its size; {sizes.train} px leaves no smaller '
                  'first stage, so it trains in one')
    progression = dataclasses.replace(progression, count=0)
  progressive.check(progression)
  return Choices(sizes, augment, reason, progression, stages_off)
