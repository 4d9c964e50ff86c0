"""Several workers over loopback, dry runs, and the TPU paths up to the TPU.

The two-worker runs are real: two `python -m launch.train` processes with a
TF_CONFIG naming two tasks on 127.0.0.1, one CPU device each, training
together under MultiWorkerMirroredStrategy.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from conftest import free_port
from conftest import tf_config
from conftest import REPO, run_train, tiny_args
from conftest import sigterm_groups_once_it_prints
from conftest import stopped_at_one_step
from configs import default
from pipeline import backends
from pipeline.backends.tensorflow import devices as tf_devices
from pipeline.backends.tensorflow import workers as tf_workers
from pipeline.data import cache
from pipeline.data import sources
from pipeline.rules.machine import hardware
from pipeline.run import plan as plan_lib
from pipeline.storage import workdirs
from pipeline.errors import UserError
from pipeline.rules.config import request as request_lib
from pipeline.rules.speed import step_counts


@pytest.mark.parametrize('text, problem', [
    ('{not json', 'malformed'),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", '
     '"index": 3}}', 'names a task not in its cluster'),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}}', 'malformed'),
])
def test_bad_tf_config_is_one_line(text, problem):
  with pytest.raises(UserError, match=problem):
    tf_workers.parse_tf_config(text)


def test_bad_tf_config_from_the_command_line(tmp_path, tfds_dir):
  result = run_train(f'--workdir={tmp_path}', f'--config.data_dir={tfds_dir}',
                     env={'TF_CONFIG': '{"cluster": {}}'}, timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert 'error: TF_CONFIG is malformed' in result.stderr


def test_a_worker_that_never_starts_stops_the_other_in_one_line(tmp_path,
                                                               tfds_dir):
  """TensorFlow's join waits for good (holding Python's lock): a watchdog
  process ends the worker within --collective_timeout_s, in one line."""
  import time  # pylint: disable=g-import-not-at-top
  began = time.monotonic()
  result = run_train(f'--workdir={tmp_path}', f'--config.data_dir={tfds_dir}',
                     '--collective_timeout_s=5', env={
                         'TF_CONFIG': tf_config([free_port()] * 2, 0)},
                     timeout=300)
  assert result.returncode == -9 and 'Traceback' not in result.stderr
  assert ('error: could not join the other workers through TF_CONFIG within '
          '5 s (--collective_timeout_s)') in result.stderr, result.stderr
  assert time.monotonic() - began < 120
  assert not (tmp_path / 'run.json').exists()


def test_a_worker_whose_port_is_taken_says_so_in_one_line(tmp_path,
                                                          tfds_dir):
  """A stale process holds the worker's port: TensorFlow's "Could not
  start gRPC server" becomes one line naming the address, at once."""
  import socket  # pylint: disable=g-import-not-at-top
  ports = [free_port(), free_port()]
  with socket.socket() as held:
    held.bind(('127.0.0.1', ports[0]))
    held.listen()
    result = run_train(f'--workdir={tmp_path}', '--dry_run',
                       f'--config.data_dir={tfds_dir}',
                       '--collective_timeout_s=60',
                       env={'TF_CONFIG': tf_config(ports, 0)}, timeout=300)
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f'error: this worker could not listen on 127.0.0.1:{ports[0]}, its '
      'address in TF_CONFIG (the port is taken: a stale run, or another '
      'worker on this network stack); end what holds it, or give the '
      'workers other ports'), result.stderr[-2000:]


def test_dry_run_resolves_and_stops_before_the_model(tmp_path, tfds_dir):
  workdir = tmp_path / 'dry'
  result = run_train(f'--workdir={workdir}', f'--config.data_dir={tfds_dir}',
                     '--dry_run', '--num_cpu_devices=2', timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'dry run: everything checks out' in result.stdout
  for line in ('MirroredStrategy, 2 replica(s)', 'Batch: 64 global, 32 per '
               'replica; 8 steps per execution (auto for CPU',
               'Data: sklearn_digits, 10 classes, 1438 train',
               'peak learning rate 0.0025 = base 0.01 x 64 global / 256'):
    assert line in result.stderr
  assert 'First execution' not in result.stderr
  assert not os.path.exists(workdir)  # Checked for writing, not created.


def test_dry_run_fails_in_one_line_for_a_bad_setup(tmp_path, tfds_dir):
  result = run_train(f'--workdir={tmp_path}', f'--config.data_dir={tfds_dir}',
                     '--dry_run', '--num_cpu_devices=2',
                     '--config.global_batch_size=65', timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert 'error: global_batch_size=65 does not split over 2 replicas' in (
      result.stderr)


def test_dry_run_names_the_visible_gpus_for_a_bad_gpus_flag(tmp_path):
  result = run_train(f'--workdir={tmp_path}', '--gpus=3', '--dry_run',
                     timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert errors == ["error: --gpus=3: '3' is not a visible GPU; visible "
                    'GPUs: none'], result.stderr[-2000:]


_GPUS = [f'/physical_device:GPU:{i}' for i in range(4)]


def _stand_in_nvidia_smi(folder, listing):
  """An `nvidia-smi` that lists GPUs as the real one does (`-L`): this
  machine has no NVIDIA driver, and the check must not need one."""
  folder.mkdir()
  script = folder / 'nvidia-smi'
  script.write_text(f'#!/bin/sh\nprintf "{listing}"\n')
  script.chmod(0o755)
  return f'{folder}{os.pathsep}{os.environ["PATH"]}'


def test_gpus_that_tensorflow_cannot_see_stop_the_run(tmp_path, monkeypatch):
  monkeypatch.setenv('PATH', _stand_in_nvidia_smi(
      tmp_path / 'bin', 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\\n'
      'GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\\n'))
  assert hardware.nvidia_gpus() == 2
  with pytest.raises(UserError, match=r'this machine has 2 NVIDIA GPU\(s\) '
                     r'\(nvidia-smi -L\) but TensorFlow .* sees none: .*install '
                     r'requirements-gpu.txt .*or pass --allow_cpu'):
    tf_devices.resolve()
  assert tf_devices.resolve(allow_cpu=True).device_kind == 'CPU'


def test_split_gpus_reads_their_memory_and_needs_gpus(tmp_path, monkeypatch):
  """--split_gpus=N shares each GPU's memory (nvidia-smi's figure, a
  stand-in here) among N logical GPUs; TensorFlow sees no GPU here, so the
  split itself stops in one line."""
  monkeypatch.setenv('PATH', _stand_in_nvidia_smi(tmp_path / 'bin',
                                                  '81559\\n81559\\n'))
  assert hardware.gpu_memory_mib() == [81559, 81559]
  assert tf_devices.split_gpus(1) is None  # Nothing to split.
  with pytest.raises(UserError, match=r'--split_gpus=2 splits GPUs; '
                     'TensorFlow sees none here'):
    tf_devices.split_gpus(2)
  with pytest.raises(UserError, match=r'--split_gpus=0 must be 1 or more'):
    tf_devices.split_gpus(0)
  monkeypatch.setenv('PATH', str(tmp_path / 'none'))
  assert hardware.gpu_memory_mib() == []


@pytest.mark.parametrize('split, environ, dali_installed, grows', [
    (1, {}, True, True),  # DALI decodes on the GPUs TensorFlow would fill.
    (1, {}, False, False),  # TensorFlow alone: its default.
    (2, {}, True, False),  # Logical GPUs: each a fixed share already.
    (1, {'TF_FORCE_GPU_ALLOW_GROWTH': 'false'}, True, False),  # The user's.
])
def test_tensorflow_grows_gpu_memory_where_dali_shares_the_gpus(
    split, environ, dali_installed, grows):
  assert tf_devices.grows_gpu_memory(split, environ, dali_installed) is grows


def test_no_nvidia_gpus_no_check(tmp_path, monkeypatch):
  """nvidia-smi lists nothing and no device file: the CPU, no check. The
  device file alone (a driver without nvidia-smi on PATH) counts one GPU."""
  monkeypatch.setenv('PATH', _stand_in_nvidia_smi(tmp_path / 'bin', ''))
  device_file = tmp_path / 'nvidia0'
  monkeypatch.setattr(hardware, 'NVIDIA_DEVICE_FILE', str(device_file))
  assert hardware.nvidia_gpus() == 0
  assert tf_devices.resolve().device_kind == 'CPU'
  device_file.write_text('')
  assert hardware.nvidia_gpus() == 1
  with pytest.raises(UserError, match=r'this machine has 1 NVIDIA GPU\(s\)'):
    tf_devices.resolve()


@pytest.mark.parametrize('spec, visible, chosen', [
    ('', _GPUS, [0, 1, 2, 3]), ('', [], []), ('0,2', _GPUS, [0, 2]),
    (' 3 , GPU:1', _GPUS, [3, 1]), ('/device:gpu:2', _GPUS, [2])])
def test_select_gpus(spec, visible, chosen):
  assert hardware.select_gpus(spec, visible) == chosen


@pytest.mark.parametrize('spec, visible, problem', [
    ('3', [], "'3' is not a visible GPU; visible GPUs: none"),
    ('4', _GPUS, "'4' is not a visible GPU; visible GPUs: GPU:0, GPU:1, "
     'GPU:2, GPU:3'),
    ('1,1', _GPUS, "'1' is named twice"), ('a', _GPUS, "'a' is not a visible"),
])
def test_select_gpus_refuses_what_is_not_there(spec, visible, problem):
  with pytest.raises(UserError, match=problem):
    hardware.select_gpus(spec, visible)


@pytest.mark.parametrize('requested, kind, steps', [
    (0, 'TPU', 100), (0, 'GPU', 8), (0, 'CPU', 8), (4, 'TPU', 4),
    (1, 'CPU', 1)])
def test_steps_per_execution_auto_and_explicit(requested, kind, steps):
  chosen, reason = step_counts.choose_steps_per_execution(requested, kind)
  assert chosen == steps
  assert ('auto' in reason) == (requested == 0)


def test_auto_steps_per_execution_fit_a_chips_staged_input():
  """configs/imagenet.py on a v5e-8 (16 GiB a chip): 256 images of 224 px
  a chip a step, 38.5 MB; 27 steps fill the 1 GiB staged beside the
  running execution, where 100 would stage 3.9 GB (and as much running)."""
  step_bytes = 2048 // 8 * 224 * 224 * 3
  chosen, reason = step_counts.choose_steps_per_execution(0, 'TPU', step_bytes)
  assert chosen == 27 == (1 << 30) // step_bytes
  assert reason == ('auto for TPU: as many steps as 1 GiB of staged input '
                    'per device holds (36.8 MiB a step)')
  assert step_counts.choose_steps_per_execution(0, 'GPU', step_bytes)[0] == 8
  assert step_counts.choose_steps_per_execution(0, 'TPU', 2 << 30)[0] == 1
  assert step_counts.choose_steps_per_execution(100, 'TPU', step_bytes)[0] == 100


def _config(**fields):
  config = default.get_config()
  config.update(fields)
  return config


@pytest.mark.parametrize('config, workdir, local', [
    (_config(data_dir='gs://b/tfds'), 'gs://b/run', []),
    (_config(data_dir='gs://b/tfds'), '/tmp/run', ["workdir='/tmp/run'"]),
    (_config(), 'gs://b/run', ["data_dir=''"]),
    (_config(dataset='tfrecord', train_files='gs://b/train-*',
             eval_files='/data/eval-*', data_dir='/ignored'), 'gs://b/run',
     ["eval_files='/data/eval-*'"]),
    (_config(data_dir='gs://b/tfds', cache='/tmp/cache'), 'gs://b/run',
     ["cache='/tmp/cache'"]),
    # An image folder's classes, read by the TPU's hosts too.
    (_config(dataset='image_folder', train_dir='/photos', data_dir='/x'),
     'gs://b/run', ["train_dir='/photos'"]),
])
def test_remote_tpu_paths_must_be_on_gcs(config, workdir, local):
  paths = {'workdir': workdir, **sources.inputs(config),
           **cache.written_paths(config.cache)}
  assert workdirs.remote_tpu_local_paths(paths) == local


def test_remote_tpu_with_a_local_workdir_stops_before_any_file_op(tmp_path):
  """plan.resolve() (what the dry run checks) on a TPU Node's Hardware.

  No TPU can exist here: the Hardware is what tf_devices.resolve returns for
  --tpu=NAME once a TPU answered, over this host's default strategy. The
  check runs before the workdir is touched.
  """
  tpu_node = hardware.Hardware(tf.distribute.get_strategy(), 'TPU',
                               tpu_workers_remote=True, detail='TPU Node')
  request = request_lib.Request(workdir=str(tmp_path / 'run'))
  with pytest.raises(UserError) as error:
    plan_lib.resolve(_config(data_dir='gs://b/tfds'), request, tpu_node)
  assert str(error.value).startswith("a TPU Node's workers run on other hosts "
                                     'and read only gs:// paths; local here: '
                                     f"workdir='{tmp_path}/run'")
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('tpu', ['missing-name', 'local',
                                 'grpc://127.0.0.1:1'])
def test_unreachable_tpu_fails_in_one_line(tmp_path, tpu):
  """No TPU exists here: each form fails where a real TPU would answer.

  --tpu=local picks its backend first (pipeline/backends/__init__.py): TensorFlow's
  TPU build where it is installed (it then finds no TPU); with neither it
  nor JAX installed, the line says what to install.
  """
  result = run_train(f'--tpu={tpu}', f'--workdir={tmp_path}', timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  expected = f"TPU '{tpu}' could not be reached"
  if tpu == 'local' and not _installed('tensorflow-tpu'):
    assert not _installed('jax')  # The JAX suite covers JAX's own line.
    expected = ('--tpu=local, but neither tensorflow-tpu nor JAX is '
                "installed; on today's TPUs (Colab, TPU7x): pip install -r "
                'requirements-jax.txt')
  assert len(errors) == 1 and expected in errors[0], errors


def _installed(distribution):
  return backends.installed(distribution) is not None


@pytest.mark.slow
def test_a_dead_worker_stops_the_other_and_both_restarted_train_together(
    tmp_path, tfds_dir):
  """SIGKILL to one worker stops the other in one line; both restarted
  resume from the chief's checkpoint and train the run to its end together:
  one MultiWorkerMirroredStrategy, the same weights, the chief alone
  writing the workdir."""
  import time  # pylint: disable=g-import-not-at-top
  ports = [free_port(), free_port()]
  workdir = tmp_path / 'run'
  args = tiny_args(str(workdir), tfds_dir, '--config.epochs=40',
                   '--config.checkpoint_every_steps=8',
                   '--collective_timeout_s=30')

  def start(index, extra=()):
    # TMPDIR: a worker killed with SIGKILL cannot remove its checkpoint
    # scratch folder (pipeline/storage/checkpoint.py); it stays under tmp_path.
    return subprocess.Popen(
        [sys.executable, '-m', 'launch.train', *args, *extra], cwd=REPO,
        env=dict(os.environ, TF_CONFIG=tf_config(ports, index),
                 TMPDIR=str(tmp_path)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

  chief, other = start(0), start(1)
  state = workdir / 'checkpoints' / 'checkpoint'
  deadline = time.time() + 500
  while not state.exists():
    assert time.time() < deadline and chief.poll() is None
    time.sleep(0.5)
  other.kill()
  killed_at = time.time()
  _, stderr = chief.communicate(timeout=300)
  waited_s = time.time() - killed_at
  assert chief.returncode != 0 and 'Traceback' not in stderr, stderr[-3000:]
  assert 'error: another worker (TF_CONFIG) stopped or never answered' in stderr
  assert waited_s < 200, waited_s

  # Restart both, with a shorter schedule: they resume from the checkpoint
  # and train to the end together.
  short = ('--config.epochs=3', '--config.export=true',
           '--accept_changes=epochs')
  chief, other = start(0, short), start(1, short)
  outputs = [p.communicate(timeout=600)[1] for p in (chief, other)]
  assert chief.returncode == 0 and other.returncode == 0, outputs[0][-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['initial_step'] >= 8
  assert metrics['strategy'] == 'MultiWorkerMirroredStrategy'
  run = json.loads((workdir / 'run.json').read_text())
  assert run['resolved']['strategy'] == 'MultiWorkerMirroredStrategy'
  for output in outputs:
    assert 'with MultiWorkerMirroredStrategy, 2 replica(s) over 2 worker(s)' \
        in output
  assert metrics['num_replicas'] == 2 and metrics['num_workers'] == 2
  digests = [re.search(r'weights sha256 (\w+)', o).group(1) for o in outputs]
  assert digests[0] == digests[1] == metrics['weights_sha256'][:16]
  # Only the chief wrote the workdir, its log file and writer lock included;
  # one run ended (the first stopped).
  assert sorted(os.listdir(workdir)) == ['.writer', 'checkpoints', 'export',
                                         'metrics.json', 'run.json',
                                         'run.log', 'tensorboard']
  assert (workdir / 'run.log').read_text().count('] Done: ') == 1


# SIGTERM to every worker at once (each VM shutting down) is Slurm's scancel
# and requeue, on these strategies too (tests/test_slurm.py).
@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_at_the_same_step(tmp_path,
                                                          tfds_dir):
  """Preemption of the non-chief (SIGTERM to its process group): the
  requests are all-reduced at every execution boundary, so both save at one
  step and exit resumably; a restart of both resumes from the chief's
  checkpoint."""
  ports = [free_port(), free_port()]
  workdir = tmp_path / 'run'

  def start(epochs):
    return [subprocess.Popen(
        [sys.executable, '-m', 'launch.train',
         *tiny_args(str(workdir), tfds_dir, f'--config.epochs={epochs}',
                    '--config.checkpoint_every_steps=1000',
                    '--accept_changes=epochs')],  # Shortened, on purpose.
        cwd=REPO, env=dict(os.environ, TF_CONFIG=tf_config(ports, i)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        process_group=0)
            for i in range(2)]

  processes = start(epochs=40)
  outputs = sigterm_groups_once_it_prints(processes, 'First execution',
                                         [1], timeout=300)
  stopped = stopped_at_one_step(processes, outputs)
  assert os.path.exists(workdir / 'checkpoints' / f'ckpt-{stopped}.index')
  assert 4 <= stopped < 24
  assert 'Another worker got SIGTERM' in outputs[0]

  processes = start(epochs=4)  # 32 steps: the rest of a shorter run.
  outputs = [p.communicate(timeout=600)[1] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-3000:]
    assert f'Resuming at step {stopped} of 32' in output
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['train_steps'] == 32 - stopped
