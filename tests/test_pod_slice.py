"""launch.pod against a stand-in for gcloud.

The Google Cloud CLI cannot be installed here, and no TPU slice exists: the
stand-in below answers `describe` with N workers and runs each `ssh
--worker=W --command=...` locally, in the repository, with worker W's
variables (a TF_CONFIG naming the workers on loopback, where a slice's JAX
would read its metadata). Everything else is real: the workers are real
`python -m launch.train` processes. The launcher ends only the trainers
it marked as the slice's (each test's slice has its own name), so other
runs on this machine are left alone.
"""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from conftest import free_port
from conftest import tf_config
from conftest import REPO
from conftest import tiny_args
from pipeline.run import pod_commands

STAND_IN = f'''#!{sys.executable}
import json, os, subprocess, sys, threading
args = sys.argv[1:]
workers = json.load(open(os.environ['GCLOUD_STAND_IN_WORKERS']))
with open(os.environ['GCLOUD_STAND_IN_CALLS'], 'a') as calls:
  calls.write(json.dumps(args) + '\\n')
if args[3] == 'describe':
  print(json.dumps({{'state': 'READY', 'networkEndpoints': [
      {{'ipAddress': '127.0.0.1'}} for _ in workers]}}))
  sys.exit(0)
options = dict(a[2:].split('=', 1) for a in args if a.startswith('--'))
if options['worker'] != 'all':
  worker = int(options['worker'])
  env = dict(os.environ, **workers[worker])
  fails = os.environ.get('GCLOUD_STAND_IN_FAILS', '').split(':')
  if fails[0] == str(worker):
    # gcloud fails before it connects (exit 1: an expired token) or ssh
    # does (255), on the worker's first `count` connections.
    count, code = int(fails[1]), int(fails[2])
    made = os.environ['GCLOUD_STAND_IN_CALLS'] + f'.{{worker}}'
    tries = len(open(made).read()) if os.path.exists(made) else 0
    open(made, 'a').write('x')
    if tries < count:
      sys.stderr.write('ERROR: (gcloud.compute.tpus.tpu-vm.ssh) There was '
                       'a problem refreshing your current auth tokens\\n'
                       if code == 1 else 'Connection closed by remote host\\n')
      sys.exit(code)
  # What ssh and gcloud say of each connection, on stderr.
  sys.stderr.write(f"Warning: Permanently added 'tpu.{{worker}}' (ED25519) "
                   "to the list of known hosts.\\n")
  sys.stderr.flush()
  if os.environ.get('GCLOUD_STAND_IN_DROPS') == str(worker):
    # The connection drops after GCLOUD_STAND_IN_UP_S seconds (0: at once),
    # mid-line or not; what it started on the worker goes on.
    # (As ssh would, the remote shell's stderr goes with the connection.)
    remote = subprocess.Popen(['bash', '-c', options['command']], env=env,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL,
                              start_new_session=True)
    def copy():
      while chunk := remote.stdout.read1(7):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    copying = threading.Thread(target=copy, daemon=True)
    copying.start()
    try:
      code = remote.wait(timeout=float(os.environ['GCLOUD_STAND_IN_UP_S']))
      copying.join()
      sys.exit(code)
    except subprocess.TimeoutExpired:
      os._exit(255)
  os.execvpe('bash', ['bash', '-c', options['command']], env)
sys.exit(max(subprocess.run(['bash', '-c', options['command']],
                            env=dict(os.environ, **env)).returncode
             for env in workers))
'''


def _launch(tmp_path, workers, train_args, *flags, name='slice', drops='',
            up_s=0, fails='', logs='logs', python=sys.executable):
  """`python -m launch.pod` with the stand-in first on PATH; each worker
  its own home (its own ~/.launch-pod); `drops`: the worker whose every
  connection drops, after `up_s` seconds; `fails`: WORKER:COUNT:CODE,
  that worker's first COUNT connections fail with CODE before the
  command runs."""
  env = _stand_in_env(tmp_path, workers, drops, up_s, fails)
  return subprocess.run(
      [sys.executable, '-m', 'launch.pod', f'--tpu={name}', '--zone=z',
       f'--repo_dir={REPO}', f'--python={python}',
       f'--worker_logs={tmp_path / logs}', *flags, '--', *train_args],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _stand_in_env(tmp_path, workers, drops='', up_s=0, fails=''):
  """The environment with the stand-in first on PATH, for `workers` (each
  its variables), each its own home."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  (bin_dir / 'gcloud').write_text(STAND_IN)
  (bin_dir / 'gcloud').chmod(0o755)
  for index, worker in enumerate(workers):
    worker['HOME'] = str(tmp_path / f'home-{index}')
  (tmp_path / 'workers.json').write_text(json.dumps(workers))
  return dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
              GCLOUD_STAND_IN_WORKERS=str(tmp_path / 'workers.json'),
              GCLOUD_STAND_IN_CALLS=str(tmp_path / 'calls.jsonl'),
              GCLOUD_STAND_IN_DROPS=drops, GCLOUD_STAND_IN_UP_S=str(up_s),
              GCLOUD_STAND_IN_FAILS=fails)


def test_every_worker_runs_the_same_command_after_earlier_runs_end(
    tmp_path, tfds_dir):
  # An earlier run's trainer, still holding the TPU on a worker, and a
  # trainer launch.pod did not start for this slice.
  name = f'slice-{uuid.uuid4().hex[:8]}'
  trainer = 'exec -a "python -m launch.train --{}" sleep 600'
  stale = subprocess.Popen(['bash', '-c', trainer.format('stale')],
                           env=dict(os.environ, PIPELINE_POD=name))
  bystander = subprocess.Popen(['bash', '-c', trainer.format('other')])
  ports = [free_port(), free_port()]
  result = _launch(tmp_path, [{'TF_CONFIG': tf_config(ports, i)}
                              for i in range(2)],
                   ['--dry_run', *tiny_args(str(tmp_path / 'run'), tfds_dir)],
                   name=name)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert stale.wait(timeout=10) == -9
  assert bystander.poll() is None
  bystander.kill()
  assert f'TPU {name}: 2 workers' in result.stdout
  assert 'all 2 workers finished' in result.stdout
  # Worker 0's lines are shown; every worker's are in its own log.
  assert ('2 processes joined by TF_CONFIG, this is process 0'
          in result.stdout)
  assert 'this is process 1' not in result.stdout
  for worker in range(2):
    log = (tmp_path / 'logs' / f'worker-{worker}.log').read_text()
    assert f'this is process {worker}' in log
    assert 'dry run: everything checks out' in log
  calls = [json.loads(line) for line in
           (tmp_path / 'calls.jsonl').read_text().splitlines()]
  assert calls[0][3] == 'describe' and '--worker=all' in calls[1]
  assert sorted(call[6] for call in calls[2:]) == ['--worker=0',
                                                   '--worker=1']
  # Each trainer wrote its log and status on its worker, apart from ssh.
  for worker in range(2):
    runs = tmp_path / f'home-{worker}' / '.launch-pod'
    [status] = runs.glob(f'{name}.*.status')  # This run's.
    assert status.read_text().strip() == '0'
    assert 'dry run: everything checks out' in (
        runs / f'{name}.log').read_text()


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_a_worker_that_fails_is_named_and_the_others_stop(tmp_path,
                                                         tfds_dir):
  """Worker 1 stops at once (a bad TF_CONFIG); worker 0, waiting for it to
  join, gets SIGTERM from the launcher, which TensorFlow's coordination
  service takes while it waits, then SIGKILL after --stop_wait_s."""
  ports = [free_port(), free_port()]
  began = time.monotonic()
  result = _launch(tmp_path, [{'TF_CONFIG': tf_config(ports, 0)},
                              {'TF_CONFIG': '{"cluster": {}}'}],
                   tiny_args(str(tmp_path / 'run'), tfds_dir),
                   '--stop_wait_s=10', name=f'slice-{uuid.uuid4().hex[:8]}')
  assert result.returncode == 1, result.stdout[-3000:] + result.stderr
  assert ('error: worker 1 exited with status 1 (error: TF_CONFIG is '
          'malformed') in result.stdout
  assert 'stopping every worker (SIGTERM' in result.stdout
  assert 'worker 0 did not stop within 10 s: ending it' in result.stdout
  assert not [line for line in subprocess.run(
      ['pgrep', '-af', 'launch.train'], capture_output=True,
      text=True).stdout.splitlines() if str(tmp_path) in line]
  assert time.monotonic() - began < 120


def test_a_dropped_connection_leaves_the_trainers_running(tmp_path,
                                                          tfds_dir):
  """ssh's exit status 255 (a laptop asleep) is no failed trainer: the
  launcher follows again, and where every try drops it says the trainers
  still run and how to follow them, and ends none."""
  name = f'slice-{uuid.uuid4().hex[:8]}'
  ports = [free_port(), free_port()]
  try:
    result = _launch(tmp_path, [{'TF_CONFIG': tf_config(ports, i)}
                                for i in range(2)],
                     # 2,000 steps: still training when the launcher
                     # gives up, however loaded the machine; killed below.
                     tiny_args(str(tmp_path / 'run'), tfds_dir,
                               '--config.epochs=250'),
                     '--reconnect_wait_s=0.5', name=name, drops='1')
    assert result.returncode == 255, result.stdout[-3000:] + result.stderr
    assert ('worker 1: the connection dropped (ssh exit 255); following its '
            'trainer again in 0.5 s (1 of 3 in a row)') in result.stdout
    assert ('error: could not follow worker 1 (the connection dropped (ssh '
            'exit 255), 3 times in a row); the trainers still run on every '
            'worker') in result.stdout
    assert f'--worker=0 \'--command=tail -f ~/.launch-pod/{name}.log\'' in (
        result.stdout)
    assert 'stopping every worker' not in result.stdout
    trainers = subprocess.run(
        ['pgrep', '-f', f'^[^ ]*python[^ ]* -m launch.train .*{tmp_path}'],
        capture_output=True, text=True).stdout.split()
    assert len(trainers) == 2, result.stdout[-3000:]
  finally:
    subprocess.run(['pkill', '-9', '-f', f'launch.train .*{tmp_path}'],
                   check=False)
    # Their followers would wait for a status no killed trainer writes.
    subprocess.run(['pkill', '-9', '-f', f'launch-pod/{name}.log'],
                   check=False)


def test_connections_that_keep_dropping_are_followed_to_the_end(tmp_path):
  """Worker 1's every connection drops after 2 s: each stayed up longer
  than --healthy_s, so the count starts again and the launcher follows its
  trainer (a stand-in writing 150 lines over 15 s, each half of a line
  0.1 s before its end, so the drops come mid-line) to the end, however
  many drops that takes. Its log is the trainer's exactly, every byte
  once, each line whole (a line cut off is sent again, whole, by the next
  connection; ssh's lines are kept apart, each on a line of its own)."""
  name = f'slice-{uuid.uuid4().hex[:8]}'
  python = tmp_path / 'python-lines'
  python.write_text('#!/bin/sh\nfor i in $(seq 150); do printf "step $i of '
                    '150: "; sleep 0.1; echo "loss 0.$i"; done\n'
                    'echo "Done: trained"\n')
  python.chmod(0o755)
  result = _launch(tmp_path, [{}, {}], [], '--reconnect_wait_s=0.2',
                   '--healthy_s=1', name=name, drops='1', up_s=2,
                   python=python)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert 'all 2 workers finished' in result.stdout
  drops = result.stdout.count('worker 1: the connection dropped')
  assert drops > 3, result.stdout[-3000:]  # More than RECONNECTS.
  assert '(1 of 3 in a row)' in result.stdout
  assert '(2 of 3 in a row)' not in result.stdout
  local = (tmp_path / 'logs' / 'worker-1.log').read_text()
  remote = (tmp_path / 'home-1' / '.launch-pod' / f'{name}.log').read_text()
  ssh_lines = [line for line in local.splitlines(keepends=True)
               if line.startswith('[gcloud] ')]
  assert len(ssh_lines) == drops + 1
  assert ''.join(line for line in local.splitlines(keepends=True)
                 if not line.startswith('[gcloud] ')) == remote
  assert remote == ''.join(f'step {i} of 150: loss 0.{i}\n'
                           for i in range(1, 151)) + 'Done: trained\n'


def test_a_trainer_that_exits_255_is_a_failure_not_a_drop(tmp_path):
  """A trainer's own exit status 255 is the trainer's: the launcher names
  the worker and stops the others; it does not follow it again."""
  python = tmp_path / 'python255'
  python.write_text('#!/bin/sh\necho "the trainer gives up"\nexit 255\n')
  python.chmod(0o755)
  result = subprocess.run(
      [sys.executable, '-m', 'launch.pod', '--tpu=slice', '--zone=z',
       f'--repo_dir={REPO}', f'--python={python}',
       f'--worker_logs={tmp_path / "logs"}', '--stop_wait_s=5', '--'],
      cwd=REPO, env=_stand_in_env(tmp_path, [{}, {}]), capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 255, result.stdout + result.stderr
  assert ('error: worker 0 exited with status 255 (the trainer gives up)'
          in result.stdout) or ('error: worker 1 exited with status 255 '
                                '(the trainer gives up)' in result.stdout)
  assert 'the connection dropped' not in result.stdout


def _stand_in_trainer(tmp_path, seconds=1):
  """A trainer that says which run it is (its arguments), takes `seconds`
  and ends 0: where what is tested is launch.pod's, not the trainer's
  (the first test runs real ones)."""
  python = tmp_path / 'python-stand-in'
  python.write_text(f'#!/bin/sh\necho "trainer of $*"\nsleep {seconds}\n'
                    'echo "trained"\n')
  python.chmod(0o755)
  return python


def test_a_second_run_on_the_same_slice_starts_from_clean_files(tmp_path):
  """The same slice name and the same homes twice, as the launcher advises
  after a lost connection: the second run's followers read its own log
  and status, never the first's."""
  name = f'slice-{uuid.uuid4().hex[:8]}'
  python = _stand_in_trainer(tmp_path)
  for run in ('first', 'second'):
    result = _launch(tmp_path, [{}, {}], [f'--workdir={run}'], name=name,
                     logs=f'logs-{run}', python=python)
    assert result.returncode == 0, (run, result.stdout[-3000:] +
                                    result.stderr)
    assert 'all 2 workers finished' in result.stdout
    for worker in range(2):
      remote = (tmp_path / f'home-{worker}' / '.launch-pod' /
                f'{name}.log').read_text()
      assert remote == ('trainer of -m launch.train '
                        f'--workdir={run}\ntrained\n'), remote
      local = (tmp_path / f'logs-{run}' / f'worker-{worker}.log').read_text()
      assert [line for line in local.splitlines()
              if not line.startswith('[gcloud] ')] == [
                  f'trainer of -m launch.train --workdir={run}', 'trained']
  # One status file, the second run's.
  statuses = list((tmp_path / 'home-0' / '.launch-pod').glob('*.status'))
  assert len(statuses) == 1 and statuses[0].read_text().strip() == '0'


@pytest.mark.parametrize('code', [1, 255])
def test_a_connection_that_fails_before_the_trainer_starts_starts_it(
    tmp_path, code):
  """Worker 1's first two connections fail before its command runs:
  gcloud's own failure (exit 1, an expired token) is named as gcloud's
  and stops no trainer; like a connection ssh lost (255), it is made again,
  and that starts the trainer, which had never started."""
  result = _launch(tmp_path, [{}, {}], [], '--reconnect_wait_s=0.2',
                   name=f'slice-{uuid.uuid4().hex[:8]}', fails=f'1:2:{code}',
                   python=_stand_in_trainer(tmp_path))
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  said = ('gcloud failed (exit 1: ERROR: (gcloud.compute.tpus.tpu-vm.ssh) '
          'There was a problem refreshing your current auth tokens)'
          if code == 1 else 'the connection dropped (ssh exit 255)')
  for count in (1, 2):
    assert (f'worker 1: {said}; following its trainer again in 0.2 s '
            f'({count} of 3 in a row)') in result.stdout, result.stdout
  assert 'stopping every worker' not in result.stdout
  assert 'all 2 workers finished' in result.stdout
  log = (tmp_path / 'logs' / 'worker-1.log').read_text()
  assert 'trainer of -m launch.train\ntrained\n' in log


def test_gcloud_that_keeps_failing_is_named_and_stops_no_trainer(tmp_path):
  """gcloud failing on every connection to worker 1 (exit 1) is gcloud's,
  not a trainer's: the launcher gives up in one line with gcloud's message
  and exit status, and worker 0's trainer goes on."""
  python = tmp_path / 'python-sleeps'
  python.write_text('#!/bin/sh\necho "training"\nexec sleep 600\n')
  python.chmod(0o755)
  name = f'slice-{uuid.uuid4().hex[:8]}'
  try:
    result = _launch(tmp_path, [{}, {}], [], '--reconnect_wait_s=0.1',
                     name=name, fails='1:99:1', python=python)
    assert result.returncode == 1, result.stdout + result.stderr
    assert ('error: could not follow worker 1 (gcloud failed (exit 1: '
            'ERROR: (gcloud.compute.tpus.tpu-vm.ssh) There was a problem '
            'refreshing your current auth tokens), 3 times in a row); the '
            'trainers still run') in result.stdout, result.stdout
    assert 'exited with status' not in result.stdout
    assert 'stopping every worker' not in result.stdout
    sleeping = subprocess.run(['pgrep', '-f', '^sleep 600$'],
                              capture_output=True, text=True).stdout.split()
    assert any(f'PIPELINE_POD={name}' in _environ(pid) for pid in sleeping)
  finally:
    subprocess.run(['bash', '-c', pod_commands.signal_trainers(name, 'KILL')],
                   check=False)
    for pid in subprocess.run(['pgrep', '-f', '^sleep 600$'],
                              capture_output=True, text=True).stdout.split():
      if f'PIPELINE_POD={name}' in _environ(pid):
        os.kill(int(pid), 9)
    subprocess.run(['pkill', '-9', '-f', f'launch-pod/{name}'], check=False)


def _environ(pid):
  try:
    with open(f'/proc/{pid}/environ', 'rb') as environ:
      return environ.read().decode('utf-8', 'replace').replace('\0', '\n')
  except OSError:
    return ''
