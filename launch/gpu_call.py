"""GPU checks, each part started only where its predicted time fits the
budget: the prepared call for a lent GPU (the main command on the JAX
route, then the same kernels in every process and Keras' own model.fit),
or with --steps=checks the whole project's claims on your GPU machine.

  python -m launch.gpu_call --out=$OUT --budget_s=510
  pip install -r requirements-gpu.txt -r requirements-dali-tf.txt
  python -m launch.gpu_call --steps=checks --photos=4096 --out=gpu-checks \
      --budget_s=2700  # send gpu-checks/call.json with the GPU's name
  python -m launch.gpu_call --out=/tmp/call --budget_s=900 --compile_s=20 \\
      --image_size=32 --batch_size=16 --config.model=efficientnet_tiny  # a CPU

pipeline/probe/gpu_call.py says what each part measures and why in that
order. One line per part as it ends, the summary last; OUT holds
call.json and call-files.tar.gz (the parts' logs and figures), rewritten
after every part. The saved picks and compile caches stay under
--cache_dir, outside OUT: a second command on the same warm machine finds
them, and the first line says whether it did. Needs the JAX environment
(requirements-jax.txt: launch.train's part reads TFRecords through
tf.data); the checks need TensorFlow's GPU build beside it
(requirements-gpu.txt).
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/default.py', 'The recipe every probe process takes '
    '(--config.KEY=VALUE overrides pass through).')
_OUT = flags.DEFINE_string('out', 'runs/gpu-call', 'The call\'s folder.')
_BUDGET_S = flags.DEFINE_integer('budget_s', 510, 'Seconds for the call.')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 224, 'Pixels per side.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 256, 'Global batch.')
_EXECUTIONS = flags.DEFINE_integer('executions', 10,
                                   'Timed executions per measurement.')
_STEPS = flags.DEFINE_integer('steps_per_execution', 8,
                              'Steps per compiled program call.')
_CLASSES = flags.DEFINE_integer('num_classes', 1000, 'Classes of the head.')
_ORDER = flags.DEFINE_list(
    'steps', None, 'The parts to run, in this order (default: the prepared '
    "call's, as pipeline/probe/gpu_call.py lists them); 'checks': the whole "
    "project's claims on your GPU machine (--budget_s=2700).")
_WORK_DIR = flags.DEFINE_string(
    'work_dir', '/tmp/gpu-call', "Where the parts write; archived into "
    'OUT/call-files.tar.gz after each.')
_CACHE_DIR = flags.DEFINE_string(
    'cache_dir', os.path.expanduser('~/.cache/pipeline-gpu-call'),
    "The parts' saved picks and compile caches (XDG_CACHE_HOME), outside "
    'OUT: kept for the next command on this machine.')
_COMPILE_S = flags.DEFINE_float(
    'compile_s', 90.0, 'Seconds one compile of the step takes, until a part '
    'measures it on this card (B0 at 224 px on an H200: 67-94 s).')
_PHOTOS = flags.DEFINE_integer(
    'photos', 1024, "The train part's photographs (10 classes).")
_TRAIN_STEPS = flags.DEFINE_integer(
    'train_steps', 256, "The train part's steps, about (whole epochs).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from pipeline.probe import gpu_call  # pylint: disable=g-import-not-at-top
  out = os.path.abspath(_OUT.value)
  os.makedirs(out, exist_ok=True)
  probe_flags = [f'--image_size={_IMAGE_SIZE.value}',
                 f'--batch_size={_BATCH_SIZE.value}',
                 f'--executions={_EXECUTIONS.value}',
                 f'--steps_per_execution={_STEPS.value}',
                 f'--num_classes={_CLASSES.value}',
                 '--config=' + config_flags.get_config_filename(
                     flags.FLAGS['config']),
                 # Overrides pass through to every process.
                 *[arg for arg in sys.argv[1:] if arg.startswith('--config.')]]
  overrides = [arg for arg in sys.argv[1:] if arg.startswith('--config.')]
  steps_an_epoch = max(_PHOTOS.value // _BATCH_SIZE.value, 1)
  train_flags = [f'--config.image_size={_IMAGE_SIZE.value}',
                 f'--config.global_batch_size={_BATCH_SIZE.value}',
                 f'--config.steps_per_execution={_STEPS.value}',
                 f'--config.epochs={-(-_TRAIN_STEPS.value // steps_an_epoch)}',
                 # One program to train, one to evaluate at the end.
                 '--config.eval_every_epochs=0',
                 '--config.progressive_stages=0', *overrides]
  order = (gpu_call.CHECKS if _ORDER.value == ['checks'] else
           _ORDER.value or gpu_call.ORDER)
  names = [part.name for part in gpu_call.PARTS]
  unknown = set(order) - set(names)
  if unknown:
    sys.exit(f'error: --steps: {", ".join(sorted(unknown))}; accepted: '
             f'{", ".join(names)}, or checks')
  figures = gpu_call.run(out, os.path.abspath(_WORK_DIR.value),
                         os.path.abspath(_CACHE_DIR.value), _BUDGET_S.value,
                         probe_flags, train_flags, order, _COMPILE_S.value,
                         _PHOTOS.value,
                         report=lambda line: print(line, flush=True))
  print(f'gpu_call: done in {figures["elapsed_s"]} s; {out}/call.json, '
        f'{out}/call-files.tar.gz')


if __name__ == '__main__':
  app.run(main)
