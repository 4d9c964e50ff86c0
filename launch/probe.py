"""Measure the JAX route on whatever accelerator JAX sees, within a budget.

  python -m launch.probe --out=/tmp/probe                  # B0, 224 px, 256
  python -m launch.probe --image_size=32 --batch_size=16 --budget_s=300 \
      --out=/tmp/probe                                     # a CPU, small

Needs JAX, Keras, ml-collections and absl-py, and no TensorFlow: it runs on
a bare GPU or TPU image with a few wheels (README, "Probe a machine").
Writes DIR/probe.json after every stage (pipeline/backends/jax/probe.py
says what each measures) and prints one line per stage; a stage that would
not end within --budget_s is skipped with its reason.
"""

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
    'policy', 'mixed_bfloat16', ['mixed_bfloat16', 'float32'],
    'The policy of every stage but (e), which is mixed_float16.')
_STAGES = flags.DEFINE_string(
    'stages', 'abcdef', 'Which stages, in this order ((a) always first).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from pipeline.backends.jax import probe  # Keras loads here, on JAX.
  unknown = set(_STAGES.value) - set(probe.STAGES)
  if unknown or not _STAGES.value:
    sys.exit(f'error: --stages={_STAGES.value!r}: letters of '
             f'{probe.STAGES!r}, e.g. abf')
  config = _CONFIG.value
  config.image_size, config.global_batch_size = (_IMAGE_SIZE.value,
                                                 _BATCH_SIZE.value)
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, 'probe.json')
  written = {}

  def save(results):
    written.update(results)
    partial = f'{path}.partial'
    with open(partial, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=2)
    os.replace(partial, path)  # A reader never sees half a file.
    for name, figures in list(results['stages'].items())[-1:]:
      print(f'probe: {name}: {json.dumps(figures)}', flush=True)

  def out_of_time():
    print(f'probe: the budget of {_BUDGET_S.value} s ran out mid-stage; '
          f'{path} holds the stages before it', flush=True)
    os._exit(2)  # pylint: disable=protected-access

  watchdog = threading.Timer(_BUDGET_S.value, out_of_time)
  watchdog.daemon = True
  watchdog.start()
  runner = probe.Probe(config, _CLASSES.value, _STEPS.value,
                       _EXECUTIONS.value, _BUDGET_S.value, save)
  print(f'probe: {json.dumps(runner.results["machine"])}', flush=True)
  save(runner.results)
  runner.run(_STAGES.value, _POLICY.value)
  watchdog.cancel()
  print(f'probe: done in {written.get("elapsed_s")} s; figures in {path}')


if __name__ == '__main__':
  app.run(main)
