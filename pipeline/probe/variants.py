"""Variants of the probe's step: the same network and batch with some config
keys, the policy or XLA's flags changed, each timed against the baseline
(the config as given, stage (a)'s step) in one budgeted run, so one lent
accelerator answers several questions.

A variant is written as its user types it: space-separated KEY=VALUE pairs
of config keys or `policy`, and XLA flags (`--xla_...`), e.g.
'batch_norm=keras squeeze_excite=conv', 'ema_decay=0.9999',
'policy=mixed_float16', 'global_batch_size=128',
'--xla_gpu_enable_command_buffer='. The baseline's compiled step is timed
again just before each variant, in the same process, and the variant's
figures carry its rate against that. XLA reads its flags once per process,
so a variant with XLA flags runs in a process of its own, started before
this one takes the devices; its rate is set against stage (a)'s.
"""

import dataclasses
import json
import os
import subprocess

from pipeline.probe import stages as probe_stages
from pipeline.rules.speed import autotune
from pipeline.launchers import Launcher
from pipeline import launchers


@dataclasses.dataclass(frozen=True)
class Variant:
  """One variant: config keys changed, the policy, XLA's flags."""
  name: str
  overrides: tuple = ()  # ((config key, value), ...)
  policy: str = ''  # '' keeps the baseline's.
  xla_flags: tuple = ()


def parse(text, config, policies):
  """The Variant `text` describes against `config`; ValueError with one
  line naming what is wrong and what is accepted."""
  overrides, policy, xla_flags = [], '', []
  for token in text.split():
    if token.startswith('--xla'):
      xla_flags.append(token)
      continue
    key, equals, value = token.partition('=')
    if not equals:
      raise ValueError(f'variant {text!r}: {token!r} is not KEY=VALUE or an '
                       'XLA flag (--xla_...)')
    if key == 'policy':
      if value not in policies:
        raise ValueError(f'variant {text!r}: policy {value!r}; accepted: '
                         f'{", ".join(policies)}')
      policy = value
    elif key in config:
      overrides.append((key, _typed(text, key, value, config[key])))
    else:
      raise ValueError(f'variant {text!r}: {key!r} is not a config key '
                       '(configs/default.py) nor policy')
  if not (overrides or policy or xla_flags):
    raise ValueError(f'variant {text!r} changes nothing')
  return Variant(text, tuple(overrides), policy, tuple(xla_flags))


def _typed(text, key, value, like):
  """`value` as the type of the config's `like`."""
  try:
    if isinstance(like, bool):
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(value)
      return value.lower() in ('true', '1')
    return type(like)(value)
  except ValueError:
    raise ValueError(f'variant {text!r}: {key}={value!r} is not a '
                     f'{type(like).__name__}') from None


def config_of(config, variant):
  """A copy of `config` with the variant's keys."""
  changed = config.copy_and_resolve_references()
  for key, value in variant.overrides:
    changed[key] = value
  return changed


def measure(probe, setup_class, baseline, variant, with_profile):
  """Compiles and times `variant` in this process, after timing the
  `baseline` Setup's step again; its figures with the ratio of the two, and
  its step's profile where `with_profile`."""
  config = config_of(probe.config, variant)
  setup = setup_class(config, probe.num_classes,
                      variant.policy or baseline.policy, probe.strategy)
  baseline_rate = probe_stages.retimed(probe, baseline)
  figures = probe_stages.timed_step(probe, setup)
  figures.update(baseline_images_per_sec=round(baseline_rate, 1),
                 of_baseline=round(figures['images_per_sec'] / baseline_rate,
                                   3))
  if with_profile:
    figures['profile'] = probe_stages.profiled(probe, setup,
                                               figures['images_per_sec'])
  return figures


def in_own_process(variant, command, budget_s, out_dir, with_profile=False):
  """Runs `command` (launch.probe's, stage (a) alone, and (g) where
  `with_profile`, its --out `out_dir`) with the variant's XLA flags added
  to XLA_FLAGS and its keys and policy as flags; stage (a)'s figures (with
  (g)'s as 'profile'), or {'failed': why}."""
  env = dict(os.environ)
  env['XLA_FLAGS'] = ' '.join(filter(None, (env.get('XLA_FLAGS'),
                                            *variant.xla_flags)))
  flags = [f'--config.{key}={value}' for key, value in variant.overrides]
  if variant.policy:
    flags.append(f'--policy={variant.policy}')
  try:
    done = subprocess.run(
        [*launchers.command(Launcher.PROBE), *command,
         '--stages=ag' if with_profile else '--stages=a',
         f'--out={out_dir}', f'--budget_s={int(budget_s)}', *flags],
        env=env, capture_output=True, text=True, timeout=budget_s + 30,
        check=False)
  except subprocess.TimeoutExpired:
    return {'failed': f'its process outlasted {budget_s:.0f} s'}
  try:
    with open(os.path.join(out_dir, 'probe.json'), encoding='utf-8') as f:
      stages = json.load(f)['stages']
    figures = stages['a_device_rate']
  except (OSError, ValueError, KeyError):
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
    return {'failed': f'exit {done.returncode}: {" ".join(tail)[:300]}'}
  if 'g_profile' in stages:
    figures['profile'] = stages['g_profile']
  # Each a candidate the autotuner could not time well: a noisy draw.
  figures['noisy_timing_lines'] = f'{done.stdout}{done.stderr}'.count(
      autotune.NOISY_TIMING)
  if variant.xla_flags:
    figures['xla_flags'] = ' '.join(variant.xla_flags)
  return figures


def against(figures, baseline_rate):
  """A variant's figures from its own process, with its rate against
  stage (a)'s."""
  if 'images_per_sec' in figures and baseline_rate:
    figures.update(
        baseline_images_per_sec=baseline_rate,
        baseline='stage (a) of the probe that started it',
        of_baseline=round(figures['images_per_sec'] / baseline_rate, 3))
  return figures
