"""Training under a real Slurm: one node, started by the fixture below.

Debian's slurmctld and slurmd (22.05; .ci/run installs them), run as root
without munge (auth/none), with the node's 2 CPUs shared by the tasks of a
job. Each test starts `python -m launch.train` through `srun` or the
repository's batch script, as a user would, on the backend of this test
environment: TensorFlow in the fast suite's, JAX in the JAX tier's
(KERAS_BACKEND=jax). Two tasks on one node stand in for two nodes: they join
through Slurm's variables exactly as on two (pipeline/rules/cluster.py).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import free_port
from conftest import REPO

BACKEND = os.environ.get('KERAS_BACKEND', 'tensorflow')
# .ci/run sets it: there, a missing Slurm fails instead of skipping.
REQUIRED = os.environ.get('PIPELINE_REQUIRE_SLURM') == '1'
# JAX on this CPU: 5 minutes a test (four processes compile or start);
# its batch-script test keeps the JAX tier's, this one the slow tier's.
SLOW_ON_JAX = pytest.mark.slow if BACKEND == 'jax' else (lambda test: test)


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  """A one-node Slurm cluster; yields the environment its commands need."""
  missing = [name for name in ('slurmctld', 'slurmd', 'srun', 'sbatch')
             if not shutil.which(name)]
  reason = (f'Slurm is not installed ({", ".join(missing)} missing): '
            'apt-get install slurmctld slurmd slurm-client' if missing else
            'a Slurm node runs as root' if os.geteuid() else None)
  if reason:
    if REQUIRED:
      pytest.fail(reason)
    pytest.skip(reason)
  root = tmp_path_factory.mktemp('slurm')
  host = socket.gethostname()
  conf = root / 'slurm.conf'
  conf.write_text('\n'.join([
      # Addresses, not names: a CI machine's own name may not resolve. The
      # node is `localhost`, which the tasks' JAX and TensorFlow reach.
      'ClusterName=test', f'SlurmctldHost={host}(127.0.0.1)', 'SlurmUser=root',
      'SlurmdUser=root', 'AuthType=auth/none', 'CredType=cred/none',
      'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none',
      'MpiDefault=none', 'SelectType=select/cons_tres',
      'SelectTypeParameters=CR_CPU', 'ReturnToService=2',
      f'SlurmctldPort={free_port()}', f'SlurmdPort={free_port()}',
      f'StateSaveLocation={root}/state', f'SlurmdSpoolDir={root}/spool',
      f'SlurmctldPidFile={root}/slurmctld.pid',
      f'SlurmdPidFile={root}/slurmd.pid',
      f'SlurmctldLogFile={root}/slurmctld.log',
      f'SlurmdLogFile={root}/slurmd.log',
      # What a site gives tasks between SIGTERM and SIGKILL (default 30 s);
      # JAX's steps on this CPU take seconds each.
      'KillWait=60',
      f'NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} '
      'State=UNKNOWN',
      'PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP '
      'OverSubscribe=YES', '']))
  (root / 'state').mkdir()
  (root / 'spool').mkdir()
  env = dict(os.environ, SLURM_CONF=str(conf),
             PATH=f'{os.path.dirname(sys.executable)}{os.pathsep}'
                  f'{os.environ["PATH"]}')
  daemons = [subprocess.Popen([*daemon, '-D', '-f', str(conf)], env=env,
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for daemon in (['slurmctld'], ['slurmd', '-N', 'localhost'])]
  try:
    deadline = time.monotonic() + 60
    while subprocess.run(['srun', '-n', '1', 'true'], env=env,
                         capture_output=True, timeout=60).returncode:
      assert time.monotonic() < deadline, (root / 'slurmctld.log').read_text()
      time.sleep(1)
    yield env
  finally:
    subprocess.run(['scancel', '--user=root'], env=env, check=False,
                   capture_output=True)
    for daemon in daemons:
      daemon.terminate()
      daemon.wait(timeout=60)


def _train_args(workdir, tfds_dir, epochs):
  """Eight steps an epoch of 32 images (16 a task), a checkpoint every
  execution; float32, the CPU's own (auto would take bfloat16 with AMX);
  B0's code at a tenth of its size (the hosts are tested, not the
  network)."""
  per_execution = 2 if BACKEND == 'jax' else 4
  return (f'--backend={BACKEND}', '--policy=float32', f'--workdir={workdir}',
          '--config.model=efficientnet_tiny',
          f'--config.data_dir={tfds_dir}', '--config.train_split=train[:256]',
          '--config.global_batch_size=32', f'--config.epochs={epochs}',
          f'--config.steps_per_execution={per_execution}',
          f'--config.log_every_steps={per_execution}',
          f'--config.checkpoint_every_steps={per_execution}',
          '--config.eval_every_epochs=0', '--config.ema_decay=0',
          # JAX compiles each run's programs once, then reads them back.
          *([f'--config.compile_cache_dir={workdir}-compiled']
            if BACKEND == 'jax' else []))


def _by_task(output):
  """srun -l's lines as {task: its text}."""
  tasks = {}
  for line in output.splitlines():
    task, sep, text = line.partition(': ')
    if sep and task.strip().isdigit():
      tasks.setdefault(int(task), []).append(text)
  return {task: '\n'.join(lines) for task, lines in tasks.items()}


def _joined(output, job):
  """Each task said how it joined the run, and with which rank."""
  tasks = _by_task(output)
  for rank in (0, 1):
    assert (f'2 replica(s) over 2 worker(s); 2 processes joined by Slurm '
            f'(job {job}), this is process {rank}') in tasks[rank], output
  return tasks


def _wait_until(condition, what, timeout=120):
  """Waits until `condition()` holds (an OSError counts as not yet)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      if condition():
        return
    except OSError:
      pass
    time.sleep(0.2)
  raise AssertionError(f'no {what} within {timeout} s')


def _wait_for(path, pattern, running, timeout=600):
  """Waits until `path` holds `pattern`, while `running()` is true."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    alive = running()
    if path.exists() and re.search(pattern, path.read_text()):
      return
    if not alive:
      break
    time.sleep(1)
  raise AssertionError(f'{pattern!r} not in {path}: '
                       f'{path.read_text()[-3000:] if path.exists() else ""}')


def _job_state(env, job):
  return subprocess.run(['squeue', '-h', '-j', job, '-o', '%T'], env=env,
                        capture_output=True, text=True).stdout.strip()


@SLOW_ON_JAX
def test_srun_trains_one_run_and_a_killed_task_stops_the_other(
    slurm, tfds_dir, tmp_path):
  """`srun -n 2` trains one run over two processes; SIGKILL to the second
  task mid-run then stops the first in one line, and the same srun again
  resumes from the last checkpoint and finishes."""
  workdir = tmp_path / 'run'
  log = tmp_path / 'srun.log'
  command = ['srun', '-n', '2', '-l', '--job-name=kill', sys.executable,
             '-m', 'launch.train', *_train_args(workdir, tfds_dir, 20)]
  with open(log, 'w') as out:
    first = subprocess.Popen(command, cwd=REPO, env=slurm, stdout=out,
                             stderr=subprocess.STDOUT)
  _wait_for(log, r'\n1: .*step \d+/160', lambda: first.poll() is None)
  _wait_until(lambda: os.listdir(workdir / 'checkpoints'), 'a checkpoint')
  job = subprocess.run(['squeue', '-h', '-n', 'kill', '-o', '%i'], env=slurm,
                       capture_output=True, text=True).stdout.strip()
  os.kill(_task_pid(workdir, 1), signal.SIGKILL)
  first.wait(timeout=180)  # The survivor exits within stopping's bound.
  output = log.read_text()
  tasks = _joined(output, job)
  assert re.search(
      rf'error: another (worker|host) \(Slurm \(job {job}\)\) stopped or '
      'never answered', tasks[0]), output[-3000:]
  assert 'Traceback' not in output, output[-3000:]
  assert _exited(output, 1) == {0}, output[-3000:]
  assert os.listdir(workdir / 'checkpoints'), 'no checkpoint before the kill'

  # The same srun, shortened to 2 epochs (16 steps): resumes and finishes.
  again = subprocess.run([*command[:-1], '--config.epochs=2'], cwd=REPO,
                         env=slurm, capture_output=True, text=True,
                         timeout=900)
  output = again.stdout + again.stderr
  assert again.returncode == 0, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['num_workers'] == 2 and metrics['joined_by'].startswith(
      'Slurm (job ')
  assert 0 < metrics['initial_step'] <= 16
  assert f'Resuming at step {metrics["initial_step"]} of 16' in output
  # Only rank 0 wrote the workdir: one end in its log, both runs' starts.
  run_log = (workdir / 'run.log').read_text()
  assert run_log.count('] Done: ') == 1 and run_log.count('] Run: ') == 2


def _exited(output, status):
  """The tasks srun says exited with `status` ('task 1: ...', 'tasks 0-1:
  ...' where they ended alike)."""
  tasks = set()
  for listed in re.findall(rf'tasks? ([\d,-]+): Exited with exit code '
                           rf'{status}\b', output):
    for part in listed.split(','):
      first, _, last = part.partition('-')
      tasks.update(range(int(first), int(last or first) + 1))
  return tasks


def _task_pid(workdir, rank):
  """The pid of the launch.train process of Slurm task `rank` for
  `workdir`."""
  for pid in os.listdir('/proc'):
    try:
      cmdline = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
      environ = open(f'/proc/{pid}/environ', 'rb').read().split(b'\0')
    except (OSError, ValueError):
      continue
    if (b'launch.train' in cmdline and
        f'--workdir={workdir}'.encode() in cmdline and
        f'SLURM_PROCID={rank}'.encode() in environ):
      return int(pid)
  raise AssertionError(f'no task {rank} for {workdir}')


def test_scancel_stops_every_task_with_a_checkpoint_and_sbatch_resumes(
    slurm, tfds_dir, tmp_path):
  """The repository's batch script, as it is (its header asks for 2 nodes:
  the command line gives this one node's 2 tasks instead). `scancel`
  mid-run: every task ends with 143 and a committed checkpoint; the same
  sbatch, waited for, resumes from it and finishes."""
  workdir = tmp_path / 'run'
  script = os.path.join(REPO, 'launch', 'train.sbatch')
  args = _train_args(workdir, tfds_dir, 2)
  sbatch = ['sbatch', '--parsable', '--nodes=1', '--ntasks-per-node=2']
  first_log = tmp_path / 'first.out'
  job = subprocess.run(
      [*sbatch, f'--output={first_log}', script, *args], cwd=REPO, env=slurm,
      capture_output=True, text=True, check=True).stdout.strip()
  _wait_for(first_log, r'First execution',
            lambda: bool(_job_state(slurm, job)))
  subprocess.run(['scancel', job], env=slurm, check=True)
  deadline = time.monotonic() + 180
  while _job_state(slurm, job) and time.monotonic() < deadline:
    time.sleep(1)
  output = first_log.read_text()
  assert _exited(output, 143) == {0, 1}, output[-3000:]
  stopped = int(re.search(r'preempted: SIGTERM: checkpoint of step (\d+) '
                          'committed', output).group(1))
  assert 'Traceback' not in output

  second_log = tmp_path / 'second.out'
  second = subprocess.run(
      [*sbatch, '--wait', f'--output={second_log}', script, *args], cwd=REPO,
      env=slurm, check=True, timeout=900, capture_output=True, text=True)
  output = second_log.read_text()
  assert f'Resuming at step {stopped} of 16' in output, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert (metrics['initial_step'], metrics['num_workers']) == (stopped, 2)
  assert metrics['joined_by'] == f'Slurm (job {second.stdout.strip()})'
