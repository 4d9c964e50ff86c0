"""Measure the JAX route on whatever accelerator JAX sees, within a budget.

  python -m launch.probe --out=/tmp/probe                  # B0, 224 px, 256
  python -m launch.probe --image_size=32 --batch_size=16 --budget_s=300 \
      --out=/tmp/probe                                     # a CPU, small

  # Stage (a) in 3 processes (this one and 2 fresh): its spread.
  python -m launch.probe --stages=ag --repeats=3 --out=/tmp/probe

  # Variants of the step, each against the baseline step timed just before:
  python -m launch.probe --stages=afg --out=/tmp/probe \
      --variant='batch_norm=keras squeeze_excite=conv' \
      --variant=ema_decay=0.9999 --variant=policy=mixed_float16 \
      --variant=--xla_gpu_experimental_enable_conv_fusion=true

Needs JAX, Keras, ml-collections and absl-py, and no TensorFlow: it runs on
a bare GPU or TPU image with a few wheels (docs/accelerators.md, "Probe a
machine").
Writes DIR/probe.json after every stage and variant
(pipeline/probe/runner.py says what each measures) and prints one
line for each; one that would not end within --budget_s is skipped with
its reason.
"""

import functools
import json
import os
import sys
import threading

os.environ['KERAS_BACKEND'] = 'jax'  # Before Keras loads: no TensorFlow.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/default.py', 'The recipe (model, optimizer, moving '
    'average); --image_size and --batch_size replace its own.')
_OUT = flags.DEFINE_string('out', 'runs/probe', 'Folder of probe.json.')
_BUDGET_S = flags.DEFINE_integer(
    'budget_s', 540, 'Seconds the probe may take; it skips what would not '
    'end in time and stops at this point in any case.')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 224, 'Pixels per side.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Global batch.')
_STEPS = flags.DEFINE_integer('steps_per_execution', 8,
                              'Steps per compiled program call.')
_EXECUTIONS = flags.DEFINE_integer('executions', 5,
                                   'Timed executions per measurement.')
_CLASSES = flags.DEFINE_integer('num_classes', 1000, 'Classes of the head.')
_POLICY = flags.DEFINE_enum(
    'policy', 'mixed_bfloat16', ['mixed_bfloat16', 'mixed_float16',
                                 'float32'],
    'The policy of every stage but (e), which is mixed_float16.')
_STAGES = flags.DEFINE_string(
    'stages', 'ahcdefg', 'Which stages, in this order ((a) always first).')
_VARIANTS = flags.DEFINE_multi_string(
    'variant', [], 'A variant of the step to time against the baseline (the '
    "config as given): space-separated KEY=VALUE of config keys or policy, "
    "and XLA flags (each set in a process of its own), e.g. 'batch_norm=keras"
    " squeeze_excite=conv'. Repeat for several.")
_REPEATS = flags.DEFINE_integer(
    'repeats', 1, 'Processes that time stage (a), this one included: each '
    "other compiles and autotunes anew (XLA's autotuner picks kernels per "
    'process), started before this one takes the devices; the spread, and '
    'for a process more than 5% off the median what differs, go in '
    '"repeats".', lower_bound=1)
_SAVE_RATE = flags.DEFINE_bool(
    'save_rate', False, "Keep stage (a)'s rate (the median over --repeats) "
    'for this card and step: a run of the same step on the JAX route says '
    'when its own step runs more than 10% below it.')
_AUTOTUNE = flags.DEFINE_enum(
    'autotune', 'load', ['load', 'fresh', 'require'],
    "XLA's convolution picks on a GPU: 'load' the ones saved for this card "
    "and software where there are some, as a run does; 'fresh': time them "
    "anew in this process; 'require': load them and fail a compile that "
    'misses one (the saved picks cover the step).')
_SAVE_AUTOTUNE = flags.DEFINE_bool(
    'save_autotune', False, "Keep the picks of the fastest process within "
    "2% of the median of --repeats for this card, software and step: every "
    'later run on the JAX route (and its probe) loads them. Implies '
    '--autotune=fresh.')
_KEEP_HLO = flags.DEFINE_bool(
    'keep_hlo', False, "Write stage (a)'s compiled step as text "
    '(OUT/step.hlo.txt).')
_SAVE_POLICY = flags.DEFINE_bool(
    'save_policy', False, 'On a GPU, after (a) and (e): keep the faster of '
    'the two policies for this GPU model and JAX version, so '
    '`launch.train --backend=jax --policy=auto` takes it there.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from pipeline.probe import picks  # pylint: disable=g-import-not-at-top
  from pipeline.rules.speed import saved_rate  # pylint: disable=g-import-not-at-top
  from pipeline.probe import runner as probe  # Keras loads here, on JAX.
  unknown = set(_STAGES.value) - set(probe.STAGES)
  if unknown or not _STAGES.value:
    sys.exit(f'error: --stages={_STAGES.value!r}: letters of '
             f'{probe.STAGES!r}, e.g. ahf')
  config = _CONFIG.value
  config.image_size, config.global_batch_size = (_IMAGE_SIZE.value,
                                                 _BATCH_SIZE.value)
  try:
    variants = probe.parse_variants(_VARIANTS.value, config)
  except ValueError as e:
    sys.exit(f'error: --variant: {e}')
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, 'probe.json')
  written = {}

  def save(results, section=None, name=None):
    written.update(results)
    partial = f'{path}.partial'
    with open(partial, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=2)
    os.replace(partial, path)  # A reader never sees half a file.
    if section:
      figures = results[section][name] if name else results[section]
      print(f'probe: {name or section}: {json.dumps(figures)}', flush=True)

  def out_of_time():
    print(f'probe: the budget of {_BUDGET_S.value} s ran out mid-stage; '
          f'{path} holds the stages before it', flush=True)
    os._exit(2)  # pylint: disable=protected-access

  watchdog = threading.Timer(_BUDGET_S.value, out_of_time)
  watchdog.daemon = True
  watchdog.start()
  # Before JAX starts XLA: where this process writes its autotuner's
  # picks (on a GPU), for --repeats to compare processes by, and the saved
  # picks it loads.
  autotune_mode = 'fresh' if _SAVE_AUTOTUNE.value else _AUTOTUNE.value
  try:
    loaded = picks.load(_OUT.value, autotune_mode)
  except ValueError as e:
    sys.exit(f'error: --autotune={autotune_mode}: {e}')
  runner = probe.run_all(
      config, _CLASSES.value, _STEPS.value, _EXECUTIONS.value,
      _BUDGET_S.value, save, _OUT.value, _STAGES.value, _POLICY.value,
      variants, _own_process_flags(autotune_mode), _REPEATS.value,
      loaded_picks=loaded, keep_hlo=_KEEP_HLO.value)
  if _SAVE_AUTOTUNE.value:
    print(f'probe: {picks.save_autotune(runner.results, functools.partial(saved_rate.step_key, config), _OUT.value)}',
          flush=True)
  if _SAVE_POLICY.value:
    print(f'probe: {probe.save_policy(runner.results)}', flush=True)
  if _SAVE_RATE.value:
    print(f'probe: {probe.save_rate(runner.results, config)}', flush=True)
  watchdog.cancel()
  print(f'probe: done in {written.get("elapsed_s")} s; figures in {path}')


def _own_process_flags(autotune_mode):
  """This probe's flags for a variant's own process (its config, sizes,
  policy and picks; not its stages, output, budget or variants)."""
  names = ('image_size', 'batch_size', 'steps_per_execution', 'executions',
           'num_classes', 'policy')
  config_file = config_flags.get_config_filename(flags.FLAGS['config'])
  return ([f'--{name}={flags.FLAGS[name].value}' for name in names] +
          [f'--autotune={autotune_mode}'] +
          [f'--config={config_file}'] +
          [arg for arg in sys.argv[1:] if arg.startswith('--config.')])


if __name__ == '__main__':
  app.run(main)
