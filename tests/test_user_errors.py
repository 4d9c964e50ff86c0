"""Bad input that needs no trained model: one line, a non-zero exit, no traceback.

Table-driven: every case is a real `python -m launch.train` process, with
--dry_run wherever the mistake is found before the model (as it should be).
The processes run as one batch, two at a time, so the table stays fast.
Files a case prepares (a damaged run.json, a file that is not a TFRecord)
are checked to be untouched afterwards.
"""

import concurrent.futures
import os

from conftest import run_train
from conftest import tree_digest
from pipeline.rules.config import request as request_lib


def _cases(root, tfds_dir):
  """(name, flags, text the one error line must hold, folder kept intact)."""
  data = f'--config.data_dir={tfds_dir}'
  (root / 'syntax.py').write_text('def get_config(:\n  pass\n')
  (root / 'raises.py').write_text('def get_config():\n  return missing\n')
  damaged = root / 'damaged_run'
  damaged.mkdir()
  (damaged / 'run.json').write_text('{"resolved": {"device_kind": "CP')
  (root / 'not_tfrecord').mkdir()
  (root / 'not_tfrecord' / 'train-0').write_text('just some text\n' * 50)
  (root / 'readme.tfrecord').write_bytes(b'')
  tfrecord = ['--config.dataset=tfrecord', '--config.num_classes=10',
              f'--config.eval_files={root / "not_tfrecord" / "train-*"}']
  work = f'--workdir={root / "run"}'
  return [
      ('config syntax error', [f'--config={root / "syntax.py"}', work],
       f"config file '{root / 'syntax.py'}' line 1: invalid syntax", None),
      ('config that raises', [f'--config={root / "raises.py"}', work],
       "NameError: name 'missing' is not defined", None),
      ('unwritable file cache', [work, data, '--dry_run',
                                 '--config.cache=/proc/forbidden/cache'],
       "cache='/proc/forbidden/cache': folder '/proc/forbidden' cannot be "
       'written', None),
      ('damaged run.json', [f'--workdir={damaged}', data, '--dry_run'],
       f'{damaged}/run.json is damaged', damaged),
      ('not a TFRecord file', [work, '--dry_run', *tfrecord,
                               f'--config.train_files={root}/not_tfrecord/*'],
       f'{root}/not_tfrecord/train-0 has no readable record', None),
      ('empty TFRecord file', [work, '--dry_run', *tfrecord,
                               f'--config.train_files={root}/*.tfrecord'],
       'readme.tfrecord has no readable record', None),
      ('GPUs TensorFlow cannot see', [work, data, '--dry_run'],
       'NVIDIA GPU(s) (nvidia-smi -L) but TensorFlow', None),
      ('init_from a folder that is no run', [
          f'--workdir={root / "finetune"}', data, '--dry_run',
          f'--config.init_from={root / "not_tfrecord"}'],
       'is not imagenet, a .h5 weights file or the workdir of a run', None),
      # The bundled digits are 8 px: a larger evaluation adds no detail.
      ('eval_image_size above the images', [
          work, data, '--dry_run', '--config.eval_image_size=64'],
       'eval_image_size=64 is larger than the images of sklearn_digits (8 '
       'px) and the training size (32 px), which adds no detail: use 0 (the '
       'training size) or at most 32', None),
      # A depthwise experiment the probe keeps (launch.probe), no form.
      ('a depthwise experiment outside the probe', [
          work, data, '--dry_run', '--config.depthwise=pallas'],
       "unknown depthwise 'pallas'; accepted: conv, conv_in_float32", None),
      ('unknown backend', [work, data, '--dry_run', '--backend=torch'],
       '--backend=torch is not a backend; accepted: auto, tensorflow, jax',
       None),
      ('JAX hosts on TensorFlow', [work, data, '--dry_run'],
       'JAX_COORDINATOR_ADDRESS joins hosts on the JAX backend; TensorFlow '
       'workers join through a Slurm job step or TF_CONFIG', None),
      # The fast suite's Python 3.11 (with no JAX: the requirements
      # install it from 3.12 on, where CI runs it).
      ('JAX asked for on Python 3.11', [work, data, '--dry_run',
                                        '--backend=jax'],
       'the JAX route runs on Python 3.12 or later (jax 0.11.2, the version '
       'tested); this is Python 3.11', None),
      # Keras' download fails (no network, or a proxy that refuses).
      ('init_from=imagenet offline', [
          f'--workdir={root / "imagenet"}', data, '--config.init_from=imagenet',
          '--config.train_split=train[:64]', '--config.epochs=1'],
       "init_from=imagenet: downloading efficientnet_b0's ImageNet weights "
       'failed', None),
  ]


def _env(name, root):
  """A stand-in nvidia-smi on PATH for the GPU case (no driver here); no
  cached Keras weights and no way out for the offline case; JAX's host
  settings for a TensorFlow run."""
  if name == 'init_from=imagenet offline':
    return {'KERAS_HOME': str(root / 'keras_home'),
            'HTTPS_PROXY': 'http://127.0.0.1:9', 'https_proxy':
            'http://127.0.0.1:9'}
  if name == 'JAX hosts on TensorFlow':
    return {'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234',
            'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '0'}
  if name != 'GPUs TensorFlow cannot see':
    return None
  folder = root / 'bin'
  folder.mkdir()
  (folder / 'nvidia-smi').write_text(
      '#!/bin/sh\necho "GPU 0: NVIDIA L4 (UUID: GPU-0)"\n')
  (folder / 'nvidia-smi').chmod(0o755)
  return {'PATH': f'{folder}{os.pathsep}{os.environ["PATH"]}'}


def test_bad_input_table(tmp_path, tfds_dir):
  cases = _cases(tmp_path, tfds_dir)
  kept = {name: tree_digest(folder) for name, _, _, folder in cases if folder}
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(
        lambda case: run_train(*case[1], env=_env(case[0], tmp_path),
                               timeout=300), cases))
  failures = []
  for (name, _, text, folder), result in zip(cases, results):
    errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
    if (result.returncode == 0 or 'Traceback' in result.stderr or
        len(errors) != 1 or text not in errors[0]):
      failures.append(f'{name}: exit {result.returncode}, error lines '
                      f'{errors}; stderr tail: {result.stderr[-1500:]}')
    if folder and tree_digest(folder) != kept[name]:
      failures.append(f'{name}: {folder} was changed')
  assert not failures, '\n'.join(failures)



def test_out_of_memory_is_one_line_naming_what_to_lower(tmp_path, tfds_dir):
  """No accelerator here can be run out of memory safely: the compiled
  function is stood in for by one that raises what TensorFlow raises then
  (ResourceExhaustedError); the plan and the message are real."""
  import pytest  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.rules.machine import hardware as devices  # pylint: disable=g-import-not-at-top
  from pipeline.run import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from pipeline.backends.tensorflow import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.update(data_dir=tfds_dir, image_size=64, global_batch_size=64)
  plan = plan_lib.resolve(
      config, request_lib.Request(workdir=str(tmp_path / 'run'),
                               policy='float32'),
      devices.Hardware(tf.distribute.get_strategy(), 'CPU', detail='host'))

  def exhausted(iterator, num_steps):
    del iterator, num_steps
    raise tf.errors.ResourceExhaustedError(None, None, 'OOM when allocating')

  trainer = trainer_lib.Trainer(
      None, None, None, exhausted, exhausted, 10, 0,
      plan.out_of_memory_message())
  with pytest.raises(UserError) as error:
    trainer.train(None, 4)
  assert str(error.value) == (
      'out of memory on CPU (host): efficientnet_b0 at image_size=64, 10 '
      'classes, with 64 images per replica (global_batch_size=64) under '
      'float32; lower '
      '--config.global_batch_size or --config.image_size, or pick a smaller '
      'model or a 16-bit --policy (half the activation memory)')


def test_out_of_memory_while_building_is_one_line(tmp_path):
  """A real ResourceExhaustedError at build time: a head of a billion
  classes (1280 x 10^9 float32 weights, 5 TB) cannot be allocated. The
  process gets a 16 GiB address-space limit, so the allocation fails the
  same way whatever the machine's overcommit setting."""
  import resource  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from conftest import REPO  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfrecord import records as tfrecords  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  image = tf.io.encode_png(np.zeros((32, 32, 3), np.uint8)).numpy()
  tfrecords.write(str(tmp_path / 'train-0'),
                  [tfrecords.serialize(image, i) for i in range(8)])
  limit = 16 << 30
  result = subprocess.run(
      [sys.executable, '-m', 'launch.train', f'--workdir={tmp_path / "run"}',
       '--config.dataset=tfrecord', '--config.num_classes=1000000000',
       f'--config.train_files={tmp_path}/train-*',
       f'--config.eval_files={tmp_path}/train-*',
       '--config.global_batch_size=8', '--policy=float32'],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                            (limit, limit)))
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert errors == [
      'error: out of memory on CPU (host CPU): efficientnet_b0 at '
      'image_size=32, 1000000000 classes, with 8 images per replica '
      '(global_batch_size=8) under float32; lower --config.global_batch_size '
      'or --config.image_size, or pick a smaller model or a 16-bit --policy '
      '(half the activation memory)'], result.stderr[-2000:]
