"""`python -m launch.train --workdir=gs://...` against a real GCS server.

The server is gcp-storage-emulator on loopback (conftest.Emulator); the
training processes reach it through STORAGE_EMULATOR_HOST, as a user's would
reach GCS through Application Default Credentials.
"""

import json
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_train, tiny_args


def _env(emulator):
  return {'STORAGE_EMULATOR_HOST': emulator.host, 'GOOGLE_CLOUD_PROJECT': 'test'}


def _start(args, emulator):
  import os  # pylint: disable=g-import-not-at-top
  return subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                          cwd=REPO, env=dict(os.environ, **_env(emulator)),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)


def _committed_steps(emulator, prefix):
  return sorted(int(n.split('/ckpt-')[1].split('/')[0])
                for n in emulator.names('runs', f'{prefix}/checkpoints/')
                if n.endswith('/COMMITTED'))


def _wait_for_commit(process, emulator, prefix, timeout_s=400):
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    if _committed_steps(emulator, prefix):
      return
    if process.poll() is not None:
      raise AssertionError('run ended early: ' + process.stderr.read()[-3000:])
    time.sleep(0.5)
  raise AssertionError('no committed checkpoint in time')


def _metrics(emulator, prefix):
  blob = emulator.client().bucket('runs').blob(f'{prefix}/metrics.json')
  return json.loads(blob.download_as_bytes())


def _args(prefix, staging, tfds_dir, lease_s=8):
  # A killed run's lease lapses in lease_s (120 s by default).
  return tiny_args(f'gs://runs/{prefix}', tfds_dir, f'--staging_dir={staging}',
                   '--config.epochs=4', '--config.checkpoint_every_steps=8',
                   f'--workdir_lease_s={lease_s}')


# Three processes, two of them training (2 min in CI): the slow tier keeps
# the fast suite in 15 min; the checkpoint protocol on the emulator is
# covered fast in test_checkpoint.py.
@pytest.mark.slow
def test_killed_run_resumes_from_the_bucket_on_a_fresh_machine(
    emulator, tfds_dir, tmp_path):
  # 40 s, not 8: machine-b imports TensorFlow and plans before it looks at
  # the lease, which took over 8 s on a busy CI machine; the lease must still
  # be live then for the wait to be what this test sees.
  process = _start(_args('fresh', tmp_path / 'machine-a', tfds_dir, 40),
                   emulator)
  try:
    _wait_for_commit(process, emulator, 'fresh')
    while 'fresh/run.log' not in emulator.names('runs', 'fresh/'):
      assert process.poll() is None  # Published with the checkpoint.
      time.sleep(0.2)
  finally:
    process.kill()
    process.wait()
  committed = _committed_steps(emulator, 'fresh')[-1]

  # Another machine: an empty staging directory, the same command.
  result = run_train(*_args('fresh', tmp_path / 'machine-b', tfds_dir, 40),
                     '--config.export=true', env=_env(emulator))
  assert result.returncode == 0, result.stderr[-3000:]
  # The killed machine's lease was fresh: machine-b waited for it to lapse
  # (it was not renewed), said so, and took it over.
  assert re.search(r'Workdir gs://runs/fresh is leased by .*: waiting up to '
                   r'\d+ s', result.stderr), result.stderr[-3000:]
  assert 'Taking over the lapsed lease' in result.stderr
  metrics = _metrics(emulator, 'fresh')
  assert metrics['initial_step'] >= committed > 0
  assert metrics['initial_step'] % 8 == 0
  names = emulator.names('runs', 'fresh/')
  for expected in ('fresh/run.json', 'fresh/metrics.json',
                   'fresh/checkpoints/ckpt-32/COMMITTED',
                   'fresh/export/saved_model.pb'):
    assert expected in names
  assert any(n.startswith('fresh/tensorboard/train/events') for n in names)
  # One log of both machines: machine-b appended to machine-a's.
  log = emulator.client().bucket('runs').blob('fresh/run.log')
  log = log.download_as_bytes().decode()
  assert log.count('] Run: ') == 2 and log.count('] Resuming at step') == 1
  assert log.index('] Saved checkpoint') < log.index('] Resuming at step')
  # Every checkpoint folder left in the bucket is committed.
  folders = {n.split('/')[2] for n in names if '/checkpoints/' in n}
  assert folders == {f'ckpt-{s}' for s in _committed_steps(emulator, 'fresh')}

  # A third machine evaluates the run from the bucket alone; the report
  # lands in the bucket and the checkpoints are left as they were.
  from conftest import run_module  # pylint: disable=g-import-not-at-top
  evaluated = run_module('launch.evaluate', '--workdir=gs://runs/fresh',
                         f'--staging_dir={tmp_path / "machine-c"}',
                         f'--config.data_dir={tfds_dir}', env=_env(emulator),
                         timeout=300)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert (f'Evaluated step 32 on sklearn_digits held-out (359 examples): '
          f'accuracy {metrics["eval_accuracy"]:.4f}') in evaluated.stdout
  after = emulator.names('runs', 'fresh/')
  assert 'fresh/evaluation/held-out-step32.json' in after
  assert [n for n in after if '/checkpoints/' in n] == [
      n for n in names if '/checkpoints/' in n]


def test_missing_bucket_fails_in_one_line_before_training(
    emulator, tfds_dir, tmp_path):
  result = run_train('--workdir=gs://no-such-bucket/run',
                     f'--config.data_dir={tfds_dir}',
                     f'--staging_dir={tmp_path}', env=_env(emulator),
                     timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and "'no-such-bucket' does not exist" in errors[0]
  assert 'First execution' not in result.stderr


# A whole training run (37 s): the slow tier keeps the fast suite in 15 min.
@pytest.mark.slow
def test_sigterm_commits_a_final_checkpoint(emulator, tfds_dir, tmp_path):
  args = tiny_args('gs://runs/preempted', tfds_dir,
                   f'--staging_dir={tmp_path}', '--config.epochs=40',
                   '--config.checkpoint_every_steps=1000')
  process = _start(args, emulator)
  deadline = time.time() + 400
  while not process.stderr.readline().count('First execution'):
    assert time.time() < deadline and process.poll() is None
  assert process.poll() is None, 'the run ended before the signal was sent'
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 143, stderr[-3000:]
  assert 'preempted: SIGTERM: checkpoint of step' in stderr
  steps = _committed_steps(emulator, 'preempted')
  assert len(steps) == 1 and steps[0] >= 4  # Only the preemption save.


# Two minutes of a run waiting out a server outage: the slow tier. The
# persistent outage is covered fast in test_checkpoint.py.
@pytest.mark.slow
def test_gcs_outage_during_a_run_is_survived(emulator, tfds_dir, tmp_path):
  process = _start(_args('outage', tmp_path, tfds_dir), emulator)
  try:
    _wait_for_commit(process, emulator, 'outage')
    emulator.stop()
    time.sleep(8)  # Uploads fail and retry with backoff meanwhile.
  finally:
    emulator.start()
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == 0, stderr[-3000:]
  assert _committed_steps(emulator, 'outage')[-1] == 32
  assert _metrics(emulator, 'outage')['train_steps'] == 32


@pytest.mark.slow
def test_sigkill_at_random_moments_never_resumes_a_partial_checkpoint(
    emulator, tfds_dir, tmp_path):
  """Kills at random times, twice: each rerun resumes a committed step."""
  rng = random.Random(0)
  prefix = 'sigkill'
  args = tiny_args(f'gs://runs/{prefix}', tfds_dir, f'--staging_dir={tmp_path}',
                   '--config.epochs=12', '--config.checkpoint_every_steps=4')
  for trial in range(2):
    before = _committed_steps(emulator, prefix)
    process = _start(args, emulator)
    _wait_for_commit(process, emulator, prefix)
    time.sleep(rng.uniform(0.0, 6.0))
    process.kill()
    process.wait()
    after = _committed_steps(emulator, prefix)
    assert after and after[-1] >= (before[-1] if before else 0), trial
  result = run_train(*args, env=_env(emulator))
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = _metrics(emulator, prefix)
  assert metrics['initial_step'] % 4 == 0 and metrics['initial_step'] > 0
  assert metrics['initial_step'] + metrics['train_steps'] == 96
