"""One writer per workdir: a local flock, a gs:// lease against the emulator.

gcp-storage-emulator (2026.7.19) ignores `if_generation_match` (measured: a
second create with if_generation_match=0 and a write with a wrong
generation both succeed), so the atomic race of two machines creating the
lease in the same instant rests on GCS's documented preconditions; the
read-before-write and read-back here hold on the emulator too, and these
tests cover every case that is not that instant: a live holder refuses a
second run, a silent one's lease lapses and is taken over, a run that lost
its lease stops.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from conftest import run_train
from conftest import tiny_args
from conftest import tree_digest
from pipeline.storage import workdirs
from pipeline.storage import workdir_lock
from pipeline.errors import UserError

_HELD = (r'workdir {url} is in use by {host} \(process {pid}\), started '
         r'\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d, last sign of life \d+ s ago; wait '
         'for that run to finish or stop it, or use another --workdir')


def _lock(url, staging, lease_s=120.0):
  return workdir_lock.WorkdirLock(workdirs.Workdir(url, str(staging),
                                                  lease_s=lease_s))


def test_a_second_local_holder_is_refused_naming_the_first(tmp_path):
  url = str(tmp_path / 'run')
  with _lock(url, tmp_path):
    with pytest.raises(UserError, match=_HELD.format(
        url=re.escape(url), host=re.escape(os.uname().nodename),
        pid=os.getpid())):
      _lock(url, tmp_path).acquire()
    with pytest.raises(UserError, match='is in use by'):
      _lock(url, tmp_path).check()  # What --dry_run says.
  with _lock(url, tmp_path):  # Released: the next run takes it.
    pass
  _lock(url, tmp_path).check()


def test_kill_9_releases_a_local_workdir_at_once(tmp_path):
  """The kernel drops a dead process's flock: no waiting, no cleaning up."""
  url = str(tmp_path / 'run')
  holder = subprocess.Popen(
      [sys.executable, '-c',
       'import sys, time\nfrom pipeline.storage import workdirs, workdir_lock\n'
       f'workdir_lock.WorkdirLock(workdirs.Workdir({url!r}, "/tmp")).acquire()\n'
       'print("held", flush=True)\ntime.sleep(600)\n'],
      cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'held'
    with pytest.raises(UserError, match=f'process {holder.pid}'):
      _lock(url, tmp_path).acquire()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  start = time.monotonic()
  with _lock(url, tmp_path):
    assert time.monotonic() - start < 1.0


def test_a_renewed_lease_refuses_a_second_machine(emulator, tmp_path):
  url = 'gs://runs/lease-live'
  with _lock(url, tmp_path / 'machine-a', lease_s=4.0):
    start = time.monotonic()
    with pytest.raises(UserError, match=_HELD.format(
        url=re.escape(url), host=re.escape(os.uname().nodename),
        pid=os.getpid())):
      _lock(url, tmp_path / 'machine-b', lease_s=4.0).acquire()
    # It watched for one renewal (every lease_s / 4), not for the lapse.
    assert time.monotonic() - start < 3.5
    assert 'lease-live/.writer' in emulator.names('runs', 'lease-live/')
  # Released: the object is gone and the next run takes the lease at once.
  assert emulator.names('runs', 'lease-live/') == []
  with _lock(url, tmp_path / 'machine-b', lease_s=4.0):
    pass


def test_a_silent_lease_lapses_and_is_taken_over(emulator, tmp_path):
  """A machine that stops renewing (preempted, killed): the next run waits
  for the lapse, says so, takes the lease over; the old holder, should it
  come back, finds it lost and stops at its next execution boundary."""
  url = 'gs://runs/lease-lapse'
  old = _lock(url, tmp_path / 'machine-a', lease_s=3.0).acquire()
  old._stop.set()  # pylint: disable=protected-access
  old._renewer.join()  # pylint: disable=protected-access
  start = time.monotonic()
  new = _lock(url, tmp_path / 'machine-b', lease_s=3.0).acquire()
  try:
    assert 2.0 < time.monotonic() - start < 6.0
    old._lock.renew()  # pylint: disable=protected-access
    with pytest.raises(UserError, match=r'workdir gs://runs/lease-lapse was '
                       r'taken over by .*; this run stopped without writing'):
      old.raise_if_lost()
    new.raise_if_lost()
  finally:
    new.release()
    old.release()  # A lost lease is not deleted: it is the new holder's.
  assert emulator.names('runs', 'lease-lapse/') == []


@pytest.mark.slow
def test_two_runs_started_together_on_one_local_workdir(tmp_path, tfds_dir):
  """Exactly one trains; the other stops in one line naming the holder and
  leaves the first's checkpoints and metrics as they are."""
  workdir = tmp_path / 'run'
  args = tiny_args(str(workdir), tfds_dir, '--config.checkpoint_every_steps=8')
  first = subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                           cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
  time.sleep(2)
  second = run_train(*args, timeout=300)
  dry = run_train(*args, '--dry_run', timeout=300)  # Says so too.
  assert dry.returncode == 1 and 'is in use by' in dry.stderr, dry.stderr
  _, first_err = first.communicate(timeout=600)
  assert first.returncode == 0, first_err[-3000:]
  errors = [l for l in second.stderr.splitlines() if l.startswith('error:')]
  assert second.returncode == 1 and 'Traceback' not in second.stderr
  assert len(errors) == 1 and f'(process {first.pid})' in errors[0], errors
  assert 'is in use by' in errors[0]
  # The first run's own results, and a third run on the finished workdir
  # (nothing left to train) leaves them as they are.
  metrics = workdirs.read_json(str(workdir / 'metrics.json'))
  assert metrics['train_steps'] == 16 and metrics['initial_step'] == 0
  checkpoints = tree_digest(str(workdir / 'checkpoints'))
  dry = run_train(*args, '--dry_run', timeout=300)
  assert dry.returncode == 0, dry.stderr[-2000:]
  assert tree_digest(str(workdir / 'checkpoints')) == checkpoints


@pytest.mark.slow
def test_a_second_machine_on_a_leased_gs_workdir_stops(emulator, tmp_path,
                                                       tfds_dir):
  """Two machines (separate staging directories), one gs:// workdir: the
  second starts while the first holds the lease and stops in one line
  naming it; the first finishes, and its lease is gone at the end."""
  env = {'STORAGE_EMULATOR_HOST': emulator.host,
         'GOOGLE_CLOUD_PROJECT': 'test'}

  def args(machine):
    return tiny_args('gs://runs/together', tfds_dir,
                     f'--staging_dir={tmp_path / machine}',
                     '--workdir_lease_s=8')

  first = subprocess.Popen([sys.executable, '-m', 'launch.train',
                            *args('machine-a')], cwd=REPO,
                           env=dict(os.environ, **env),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
  deadline = time.time() + 120
  while 'together/.writer' not in emulator.names('runs', 'together/'):
    assert time.time() < deadline and first.poll() is None
    time.sleep(0.2)
  second = run_train(*args('machine-b'), env=env, timeout=300)
  _, first_err = first.communicate(timeout=600)
  assert first.returncode == 0, first_err[-3000:]
  errors = [l for l in second.stderr.splitlines() if l.startswith('error:')]
  assert second.returncode == 1 and 'Traceback' not in second.stderr
  assert len(errors) == 1 and f'(process {first.pid})' in errors[0], errors
  names = emulator.names('runs', 'together/')
  assert 'together/metrics.json' in names and 'together/.writer' not in names
