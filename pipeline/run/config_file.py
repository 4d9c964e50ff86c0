"""A plan's config as a Python file (--print_config): every key, the ones
the config left open to the run filled with what the plan chose and why,
so a user can save it and pass it back with --config=FILE for the same
plan."""

import dataclasses

from pipeline.recipe import progressive


def text(plan, command):
  """The file, for the run `command` (the command line) resolved."""
  chosen = dataclasses.asdict(plan.chosen.resolved)
  why = {'image_size': plan.image_sizes.train_from,
         'eval_image_size': plan.image_sizes.eval_from,
         'augment': plan.chosen.augment_reason,
         'progressive_stages': "the network's recipe" if
         plan.config.progressive_stages == progressive.FAMILY else ''}
  lines = [f'"""The resolved config of: {command}', '',
           'Printed by --print_config; pass it back with --config=FILE.',
           '"""', '', 'import ml_collections', '', '',
           'def get_config():',
           '  config = ml_collections.ConfigDict()']
  for key, value in plan.config.to_dict().items():
    left_open = key in chosen and chosen[key] != value
    lines.append(f'  config.{key} = {chosen[key] if left_open else value!r}'
                 + (f'  # Left open: {why[key]}' if left_open and why[key]
                    else ''))
  return '\n'.join(lines + ['  return config', ''])
