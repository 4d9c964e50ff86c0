"""Several workers over loopback, dry runs, and the TPU paths up to the TPU.

The two-worker runs are real: two `python -m launch.train` processes with a
TF_CONFIG naming two tasks on 127.0.0.1, one CPU device each, training
together under MultiWorkerMirroredStrategy.
"""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import REPO, run_train, tiny_args
from pipeline import devices
from pipeline.errors import UserError


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _tf_config(ports, index):
  return json.dumps({'cluster': {'worker': [f'127.0.0.1:{p}' for p in ports]},
                     'task': {'type': 'worker', 'index': index}})


def test_two_workers_train_together(tmp_path, tfds_dir):
  ports = [_free_port(), _free_port()]
  workdir = tmp_path / 'run'
  args = tiny_args(str(workdir), tfds_dir)
  processes = [subprocess.Popen(
      [sys.executable, '-m', 'launch.train', *args], cwd=REPO,
      env=dict(os.environ, TF_CONFIG=_tf_config(ports, i)),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
  outputs = [p.communicate(timeout=600)[1] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['strategy'] in ('MultiWorkerMirroredStrategy',
                                 'CollectiveAllReduceStrategy')
  assert metrics['num_replicas'] == 2 and metrics['num_workers'] == 2
  digests = [re.search(r'weights sha256 (\w+)', o).group(1) for o in outputs]
  assert digests[0] == digests[1] == metrics['weights_sha256'][:16]
  # Only the chief wrote the workdir.
  assert sorted(os.listdir(workdir)) == ['checkpoints', 'export',
                                         'metrics.json', 'run.json',
                                         'tensorboard']


@pytest.mark.parametrize('text, problem', [
    ('{not json', 'malformed'),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", '
     '"index": 3}}', 'names a task not in its cluster'),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}}', 'malformed'),
])
def test_bad_tf_config_is_one_line(text, problem):
  with pytest.raises(UserError, match=problem):
    devices.parse_tf_config(text)


def test_bad_tf_config_from_the_command_line(tmp_path, tfds_dir):
  result = run_train(f'--workdir={tmp_path}', f'--config.data_dir={tfds_dir}',
                     env={'TF_CONFIG': '{"cluster": {}}'}, timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert 'error: TF_CONFIG is malformed' in result.stderr


def test_dry_run_resolves_and_stops_before_the_model(tmp_path, tfds_dir):
  workdir = tmp_path / 'dry'
  result = run_train(f'--workdir={workdir}', f'--config.data_dir={tfds_dir}',
                     '--dry_run', '--num_cpu_devices=2', timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'dry run: everything checks out' in result.stdout
  for line in ('MirroredStrategy, 2 replica(s)', 'Batch: 64 global, 32 per '
               'replica', 'Data: sklearn_digits, 10 classes, 1438 train'):
    assert line in result.stderr
  assert 'First execution' not in result.stderr
  assert os.listdir(workdir) == []  # Checked for writing, nothing written.


def test_dry_run_fails_in_one_line_for_a_bad_setup(tmp_path, tfds_dir):
  result = run_train(f'--workdir={tmp_path}', f'--config.data_dir={tfds_dir}',
                     '--dry_run', '--num_cpu_devices=2',
                     '--config.global_batch_size=65', timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert 'error: global_batch_size=65 does not split over 2 replicas' in (
      result.stderr)


@pytest.mark.parametrize('tpu', ['missing-name', 'local',
                                 'grpc://127.0.0.1:1'])
def test_unreachable_tpu_fails_in_one_line(tmp_path, tpu):
  """No TPU exists here: each form fails where a real TPU would answer."""
  result = run_train(f'--tpu={tpu}', f'--workdir={tmp_path}', timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and f"TPU '{tpu}' could not be reached" in errors[0]


@pytest.mark.slow
def test_a_dead_worker_stops_the_other_and_a_restart_resumes(tmp_path,
                                                             tfds_dir):
  import time  # pylint: disable=g-import-not-at-top
  ports = [_free_port(), _free_port()]
  workdir = tmp_path / 'run'
  args = tiny_args(str(workdir), tfds_dir, '--config.epochs=40',
                   '--config.checkpoint_every_steps=8',
                   '--collective_timeout_s=30')

  def start(index, extra=()):
    return subprocess.Popen(
        [sys.executable, '-m', 'launch.train', *args, *extra], cwd=REPO,
        env=dict(os.environ, TF_CONFIG=_tf_config(ports, index)),
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
  assert 'error: another worker stopped or never answered' in stderr
  assert waited_s < 200, waited_s

  # Restart both, with a shorter schedule: they resume from the checkpoint.
  short = ('--config.epochs=3',)
  chief, other = start(0, short), start(1, short)
  outputs = [p.communicate(timeout=600)[1] for p in (chief, other)]
  assert chief.returncode == 0 and other.returncode == 0, outputs[0][-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['initial_step'] >= 8 and metrics['num_replicas'] == 2
