"""Training under a real Slurm of two nodes, started by the fixture below.

tests/slurm_nodes.py makes the nodes on this machine: each its own network
namespace, address and host name, its own slurmd, one slurmctld; each with
four stand-in GPUs Slurm binds to tasks (CUDA_VISIBLE_DEVICES) though no
framework finds a GPU behind them. Each test starts `python -m
launch.train` through `srun` or the repository's batch script, as a user
would, on the backend of this test environment: TensorFlow in the fast
suite's, JAX in the JAX tier's (KERAS_BACKEND=jax). .ci/run installs Slurm
(Debian's 22.05) and iproute2; there a missing Slurm fails, not skips.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
import slurm_nodes

BACKEND = os.environ.get('KERAS_BACKEND', 'tensorflow')
# .ci/run sets it: there, a missing Slurm fails instead of skipping.
REQUIRED = os.environ.get('PIPELINE_REQUIRE_SLURM') == '1'
# JAX on this CPU: each binding's run takes half a minute (its processes
# start JAX): the slow tier's.
SLOW_ON_JAX = pytest.mark.slow if BACKEND == 'jax' else (lambda test: test)


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  """Two Slurm nodes of 4 stand-in GPUs; yields the environment their
  commands need."""
  reason = slurm_nodes.missing()
  if reason:
    if REQUIRED:
      pytest.fail(reason)
    pytest.skip(reason)
  with slurm_nodes.cluster(tmp_path_factory.mktemp('slurm')) as env:
    yield env


def _train_args(workdir, tfds_dir, epochs=None):
  """Eight steps an epoch of 32 images (16 a task), `epochs` of them (or
  as the config says), a checkpoint every execution; float32, whatever a
  sweep saved on this machine would make auto take; B0's code at a fraction of its
  size (the hosts are tested, not the network)."""
  per_execution = 2 if BACKEND == 'jax' else 4
  return (f'--backend={BACKEND}', '--policy=float32', f'--workdir={workdir}',
          '--config.model=efficientnet_tiny',
          f'--config.data_dir={tfds_dir}', '--config.train_split=train[:256]',
          '--config.global_batch_size=32',
          *([f'--config.epochs={epochs}'] if epochs else []),
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


# The requeue first: its segments take minutes of wall time, and a
# module's last tests are where pytest-xdist queues another module behind
# them on the same process (while the other process may idle).
#
# Each segment's time limit is brought near once it trains: the limit is
# then 2 to 3 minutes away, the signal 4 minutes before it, so Slurm's next
# check of limits (every 30 s) signals the job with over a minute left to
# commit and requeue; the limit is set far again for the next segment. A
# fixed limit would have to leave room for the slowest start (JAX compiles
# for 40 s here), and every segment would train that long for nothing.
LIMIT_MINUTES, SIGNAL_S = 10, 240


def _signal_soon(env, job):
  """Sets the job's time limit 120 to 180 s past its run time so far."""
  run_time = subprocess.run(['squeue', '-h', '-j', job, '-o', '%M'], env=env,
                            capture_output=True, text=True,
                            check=True).stdout.strip()
  days, _, clock = run_time.rpartition('-')
  seconds = 0
  for part in clock.split(':'):
    seconds = seconds * 60 + int(part)
  seconds += int(days or 0) * 86400
  subprocess.run(['scontrol', 'update', f'JobId={job}',
                  f'TimeLimit={seconds // 60 + 3}'], env=env, check=True)


_ENDLESS = 10_000  # Epochs: more than two segments train on any machine.
# The run's length, in a config file each segment reads as it starts: far
# more than two segments could train on any machine, then, once the second
# stop is committed, a few steps past it (as a user may shorten a run).
_RUN_LENGTH = """from configs import default


def get_config():
  config = default.get_config()
  config.epochs = {epochs}
  return config
"""


@pytest.mark.slow  # Three segments of a minute or two each.
def test_a_job_at_its_time_limit_requeues_twice_and_finishes(
    slurm, tfds_dir, tmp_path):
  """The batch script with an `srun hostname` added before the training
  step (the time limit's TERM must still find the training step), copied
  out of the checkout and submitted from another folder (PIPELINE_DIR
  names the checkout), its time limit brought near once each segment
  trains (on JAX the limit's USR1 sent at once instead): each time every
  task commits a checkpoint, the job requeues
  itself (same job id, output appended) and resumes where it stopped;
  after the second stop the run is shortened to end three epochs later,
  and it finishes."""
  workdir = tmp_path / 'run'
  log = tmp_path / 'job.out'
  script = tmp_path / 'train.sbatch'
  original = open(os.path.join(REPO, 'launch', 'train.sbatch')).read()
  training = original.index('(srun --kill-on-bad-exit')
  script.write_text(original[:training] + 'srun hostname\n' +
                    original[training:])
  length = tmp_path / 'run_length.py'
  length.write_text(_RUN_LENGTH.format(epochs=_ENDLESS))
  job = subprocess.run(
      ['sbatch', '--parsable', '--gpus-per-node=0',
       f'--time={LIMIT_MINUTES}', f'--signal=B:USR1@{SIGNAL_S}',
       f'--output={log}', str(script), f'--config={length}',
       *_train_args(workdir, tfds_dir), '--accept_changes=epochs'],
      cwd=tmp_path, env=dict(slurm, PIPELINE_DIR=REPO), capture_output=True,
      text=True, check=True).stdout.strip()
  running = lambda: bool(_job_state(slurm, job))
  stop = r'preempted: SIGTERM: checkpoint of step (\d+) committed'
  for segment in (1, 2):
    # It trains: a step's line since it started (the second says where it
    # resumes first).
    since_start = lambda: (log.read_text().partition('Resuming at step')[2]
                           if segment > 1 else log.read_text())
    _wait_until(lambda: re.search(r'step \d+/\d+ \(epoch', since_start())
                or not running(), f'training in segment {segment}',
                timeout=600)
    if BACKEND == 'jax':
      # The time limit's own signal is TensorFlow's run's to show; here the
      # same USR1 goes to the script at once (Slurm checks limits every 30
      # s, in whole minutes: each segment would train minutes for nothing).
      subprocess.run(['scancel', '--signal=USR1', '--batch', job],
                     env=slurm, check=True)
    else:
      _signal_soon(slurm, job)
    # Both tasks say they stopped: two lines a stop.
    _wait_until(lambda: len(re.findall(stop, log.read_text())) >= 2 * segment
                or not running(), f'stop {segment}', timeout=300)
    if BACKEND != 'jax':
      # The limit far again before the requeued job starts (some seconds
      # after the stop: Slurm's requeue).
      subprocess.run(['scontrol', 'update', f'JobId={job}',
                      f'TimeLimit={LIMIT_MINUTES}'], env=slurm, check=True)
  second_stop = int(re.findall(stop, log.read_text())[-1])
  epochs = second_stop // 8 + 3
  staged = tmp_path / 'run_length.tmp'
  staged.write_text(_RUN_LENGTH.format(epochs=epochs))
  staged.replace(length)
  _wait_until(lambda: (workdir / 'metrics.json').exists() and not running(),
              'end of the job', timeout=900)
  output = log.read_text()
  assert output.count(f'train.sbatch: the time limit is near; every task '
                      f'commits a checkpoint, then job {job} requeues and '
                      'resumes from it') == 2, output[-3000:]
  stopped = [int(step) for step in re.findall(stop, output)]
  resumed = [(int(step), int(total)) for step, total in re.findall(
      r'Resuming at step (\d+) of (\d+)', output)]
  print(f'{BACKEND}: stopped at {stopped}, resumed at {resumed}')
  # Each task says it stopped; each segment resumes where the last stopped.
  assert len(stopped) == 4 and stopped[0] == stopped[1] < stopped[2] == (
      stopped[3]), output[-3000:]
  assert resumed[::2] == [(stopped[0], 8 * _ENDLESS),
                          (stopped[2], 8 * epochs)], output[-3000:]
  # The step before the training step ran in every segment, on each node.
  assert output.count('slurmnode1\n') >= 3
  assert 'Traceback' not in output and 'not requeued' not in output
  assert re.search(r'Done: eval_accuracy [\d.]+, ', output), output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['joined_by'] == f'Slurm (job {job})'
  assert metrics['initial_step'] == stopped[2]
  assert metrics['train_steps'] == 8 * epochs - stopped[2]


@pytest.mark.slow  # Two to four minutes: CI's slow tier, on both backends.
def test_srun_trains_one_run_and_a_killed_task_stops_the_other(
    slurm, tfds_dir, tmp_path):
  """`srun -N 2` trains one run over the two nodes, no Slurm command on the
  tasks' PATH (as inside a container); SIGKILL to the second task mid-run
  then stops the first in one line, and the same srun again resumes from
  the last checkpoint and finishes."""
  workdir = tmp_path / 'run'
  log = tmp_path / 'srun.log'
  command = [shutil.which('srun', path=slurm['PATH']), '-N', '2', '-l',
             '--job-name=kill', sys.executable, '-m', 'launch.train',
             *_train_args(workdir, tfds_dir, 20)]
  # The tasks find no Slurm command (as in a container): the node list is
  # expanded without scontrol.
  tasks_env = dict(slurm, PATH=os.path.dirname(sys.executable))
  assert not shutil.which('scontrol', path=tasks_env['PATH'])
  with open(log, 'w') as out:
    first = subprocess.Popen(command, cwd=REPO, env=tasks_env, stdout=out,
                             stderr=subprocess.STDOUT)
  _wait_for(log, r'\n1: .*step \d+/160', lambda: first.poll() is None)
  # A committed checkpoint, not any file of one being written (JAX's
  # arrive as a temporary file, renamed once whole).
  _wait_until(lambda: _committed_steps(workdir), 'a committed checkpoint')
  committed = _committed_steps(workdir)
  job = subprocess.run(['squeue', '-h', '-n', 'kill', '-o', '%i'], env=slurm,
                       capture_output=True, text=True).stdout.strip()
  os.kill(_task_pid(workdir, 1), signal.SIGKILL)
  first.wait(timeout=180)  # The survivor exits within stopping's bound.
  newest = max(_committed_steps(workdir))
  output = log.read_text()
  tasks = _joined(output, job)
  assert re.search(
      rf'error: another (worker|host) \(Slurm \(job {job}\)\) stopped or '
      'never answered', tasks[0]), output[-3000:]
  assert 'Traceback' not in output, output[-3000:]
  assert _exited(output, 1) == {0}, output[-3000:]

  # The same srun, ended two epochs past the newest checkpoint (how far
  # the run got before the kill is the machine's speed): resumes there and
  # finishes.
  total = (newest // 8 + 2) * 8
  again = subprocess.run([*command, f'--config.epochs={total // 8}',
                          '--accept_changes=epochs'],
                         cwd=REPO, env=tasks_env, capture_output=True,
                         text=True, timeout=900)
  output = again.stdout + again.stderr
  assert again.returncode == 0, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['num_workers'] == 2 and metrics['joined_by'].startswith(
      'Slurm (job ')
  # It resumed from the newest checkpoint, no older than those committed
  # before the kill.
  assert max(committed) <= newest == metrics['initial_step'] < total
  assert f'Resuming at step {newest} of {total}' in output
  # Only rank 0 wrote the workdir: one end in its log, both runs' starts.
  run_log = (workdir / 'run.log').read_text()
  assert run_log.count('] Done: ') == 1 and run_log.count('] Run: ') == 2


def _committed_steps(workdir):
  """The steps of the checkpoints `workdir` holds (ckpt-N.index files)."""
  return [int(name.split('-')[1].split('.')[0]) for name in
          os.listdir(workdir / 'checkpoints') if re.fullmatch(
              r'ckpt-\d+\.(index|weights\.h5)', name)]


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


@pytest.mark.slow  # Two minutes: CI's slow tier.
@pytest.mark.skipif(BACKEND != 'tensorflow', reason='on TensorFlow: JAX '
                    "takes scancel's TERM in the requeue test below")
def test_scancel_stops_every_task_with_a_checkpoint_and_sbatch_resumes(
    slurm, tfds_dir, tmp_path):
  """The repository's batch script, as it is, submitted from outside the
  checkout, over the two nodes (the command line asks for their 4 GPUs
  each, where the script asks for 8).
  `scancel` mid-run: every task ends with 143 and a committed checkpoint;
  the same sbatch, waited for, resumes from it and finishes, one process
  on each node with all of its GPUs."""
  workdir = tmp_path / 'run'
  script = os.path.join(REPO, 'launch', 'train.sbatch')
  # Long enough that scancel finds it training on any machine.
  args = _train_args(workdir, tfds_dir, 20)
  sbatch = ['sbatch', '--parsable', '--gpus-per-node=4']
  first_log = tmp_path / 'first.out'
  # Submitted from another folder: the script finds its checkout.
  job = subprocess.run(
      [*sbatch, f'--output={first_log}', script, *args], cwd=tmp_path,
      env=slurm, capture_output=True, text=True, check=True).stdout.strip()
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

  # The same sbatch, the run ended two epochs past the stop.
  total = (stopped // 8 + 2) * 8
  second_log = tmp_path / 'second.out'
  second = subprocess.run(
      [*sbatch, '--wait', f'--output={second_log}', script, *args,
       f'--config.epochs={total // 8}', '--accept_changes=epochs'],
      cwd=tmp_path, env=slurm, check=True, timeout=900, capture_output=True,
      text=True)
  output = second_log.read_text()
  assert f'Resuming at step {stopped} of {total}' in output, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert (metrics['initial_step'], metrics['num_workers']) == (stopped, 2)
  assert metrics['joined_by'] == f'Slurm (job {second.stdout.strip()})'
  # One process a node, each with all four of its node's GPUs.
  assert output.count('; GPUs 0,1,2,3 (all this host shows it; '
                      'CUDA_VISIBLE_DEVICES=0,1,2,3)') == 2, output[-3000:]


def test_a_job_array_is_refused_in_one_line(slurm, tfds_dir, tmp_path):
  """Every element of an array would train the same --workdir (and
  requeue one another): the script refuses before any step starts."""
  log = tmp_path / 'array-%a.out'
  subprocess.run(
      ['sbatch', '--parsable', '--wait', '--array=0-1', '--gpus-per-node=0',
       f'--output={log}', os.path.join(REPO, 'launch', 'train.sbatch'),
       *_train_args(tmp_path / 'run', tfds_dir, 1)],
      cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=300,
      check=False)
  for element in (0, 1):
    output = (tmp_path / f'array-{element}.out').read_text()
    assert re.fullmatch(
        r'train\.sbatch: error: job \d+ is an array \(--array\): every '
        r'element would train the same --workdir; submit one job per run\n',
        output), output
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow  # A minute or two: CI's slow tier.
@pytest.mark.skipif(BACKEND != 'tensorflow', reason='the script is the same '
                    'on both backends; four JAX processes on two cores take '
                    'minutes')
def test_one_process_per_gpu_through_the_script_and_the_requeue_cap(
    slurm, tfds_dir, tmp_path):
  """docs/clusters.md's one-process-per-GPU form through the batch script
  (`--ntasks-per-node=2 --gpus-per-task=1` on the two nodes): four tasks,
  each on the GPU Slurm bound to it, train one run. With MAX_REQUEUES=0,
  the time limit's signal (USR1 to the script, as --signal=B:USR1 sends
  it) stops every task with a committed checkpoint, and the job is not
  requeued: one line says so."""
  log = tmp_path / 'job.out'
  job = subprocess.run(
      ['sbatch', '--parsable', '--ntasks-per-node=2', '--gpus-per-task=1',
       '--gpus-per-node=2', f'--output={log}',
       os.path.join(REPO, 'launch', 'train.sbatch'),
       *_train_args(tmp_path / 'run', tfds_dir, _ENDLESS)],
      cwd=tmp_path, env=dict(slurm, MAX_REQUEUES='0'), capture_output=True,
      text=True, check=True).stdout.strip()
  running = lambda: bool(_job_state(slurm, job))
  _wait_for(log, r'step \d+/\d+ \(epoch', running)
  subprocess.run(['scancel', '--signal=USR1', '--batch', job], env=slurm,
                 check=True)
  _wait_until(lambda: not running(), 'the end of the job', timeout=300)
  output = log.read_text()
  assert output.count('preempted: SIGTERM: checkpoint of step') == 4, (
      output[-3000:])
  for gpu in (0, 1):
    assert output.count(f'GPUs {gpu} (bound to this task by Slurm: '
                        f'--gpus-per-task=1; CUDA_VISIBLE_DEVICES={gpu})') == (
                            2), output[-3000:]
  assert (f'train.sbatch: not requeued: job {job} was requeued 0 times '
          '(SLURM_RESTART_COUNT), the cap (MAX_REQUEUES=0); its checkpoint '
          'is committed: sbatch the same command again to go on') in output
  assert 'Resuming at step' not in output
  assert 'Traceback' not in output


# Each binding: srun's options for two tasks a node, and each task's GPUs
# as its own launch.train resolves them, by node and local rank.
BINDINGS = {
    'gpus-per-task=1': (
        ['--gpus-per-task=1'],
        ['GPUs 0 (bound to this task by Slurm: --gpus-per-task=1; '
         'CUDA_VISIBLE_DEVICES=0)',
         'GPUs 1 (bound to this task by Slurm: --gpus-per-task=1; '
         'CUDA_VISIBLE_DEVICES=1)']),
    'gpus-per-task=2': (
        ['--gpus-per-task=2'],
        ['GPUs 0,1 (bound to this task by Slurm: --gpus-per-task=2; '
         'CUDA_VISIBLE_DEVICES=0,1)',
         'GPUs 2,3 (bound to this task by Slurm: --gpus-per-task=2; '
         'CUDA_VISIBLE_DEVICES=2,3)']),
    # Slurm sets no CUDA_VISIBLE_DEVICES: each task is shown the node's
    # four (nvidia-smi, a stand-in here) and keeps its own two.
    'gpu-bind=none': (
        ['--gpus-per-task=2', '--gpu-bind=none'],
        ["GPUs 0,1 (its share of 4, by local rank 0 of 2: 2 of the node's 4 "
         '(SLURM_GPUS_ON_NODE) for each of its 2 tasks; Slurm bound none '
         '(gpu:none); CUDA_VISIBLE_DEVICES=0,1 of nvidia-smi -L: 4)',
         "GPUs 2,3 (its share of 4, by local rank 1 of 2: 2 of the node's 4 "
         '(SLURM_GPUS_ON_NODE) for each of its 2 tasks; Slurm bound none '
         '(gpu:none); CUDA_VISIBLE_DEVICES=2,3 of nvidia-smi -L: 4)']),
    # Both tasks shown all four: half each, by local rank.
    'gpus-per-node=4': (
        ['--gpus-per-node=4'],
        ["GPUs 0,1 (its share of 4, by local rank 0 of 2: 2 of the node's 4 "
         '(SLURM_GPUS_ON_NODE) for each of its 2 tasks; Slurm bound none; '
         'CUDA_VISIBLE_DEVICES=0,1 of CUDA_VISIBLE_DEVICES=0,1,2,3)',
         "GPUs 2,3 (its share of 4, by local rank 1 of 2: 2 of the node's 4 "
         '(SLURM_GPUS_ON_NODE) for each of its 2 tasks; Slurm bound none; '
         'CUDA_VISIBLE_DEVICES=2,3 of CUDA_VISIBLE_DEVICES=0,1,2,3)']),
}


# Which GPUs a task keeps is the same rule on both backends
# (pipeline/rules/machine/placement.py), each binding tested on
# TensorFlow's; on JAX, whose four processes take half a minute a binding,
# the one that asks the most of it (nvidia-smi, SLURM_GPUS_ON_NODE).
# On TensorFlow two bindings are fast and two slow (the fast suite's 12
# minutes: each takes 20-25 s of a module's process).
BINDINGS_ON_THIS_BACKEND = (
    ['gpus-per-task=1', 'gpus-per-task=2'] + [
        pytest.param(name, marks=pytest.mark.slow)
        for name in ('gpus-per-node=4', 'gpu-bind=none')]
    if BACKEND == 'tensorflow' else ['gpu-bind=none'])


@SLOW_ON_JAX
@pytest.mark.parametrize('binding', BINDINGS_ON_THIS_BACKEND)
def test_every_task_trains_on_the_gpus_slurm_gave_it(slurm, tfds_dir,
                                                     binding, tmp_path):
  """Four tasks over the two nodes, two a node, each a `launch.train
  --dry_run` that resolves its hardware as a run does (joining the
  others): each says which GPUs it keeps, and the CUDA_VISIBLE_DEVICES it
  now has, for every binding. The node's GPUs are stand-ins, and so is
  nvidia-smi (what the driver would list where Slurm sets no
  CUDA_VISIBLE_DEVICES); --allow_cpu, as no framework finds a GPU."""
  options, lines = BINDINGS[binding]
  result = subprocess.run(
      ['srun', '-N', '2', '--ntasks-per-node=2', '-l', *options,
       sys.executable, '-m', 'launch.train', '--dry_run', '--allow_cpu',
       f'--backend={BACKEND}', '--config.model=efficientnet_tiny',
       f'--config.data_dir={tfds_dir}', '--config.train_split=train[:64]'],
      cwd=REPO, env=dict(slurm, PATH=f'{_stand_in_nvidia_smi(tmp_path)}'
                         f'{os.pathsep}{slurm["PATH"]}'),
      capture_output=True, text=True, timeout=600, check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  tasks = _by_task(output)
  for rank in range(4):  # Block layout: ranks 0, 1 on the first node.
    said = re.search(r'; (GPUs [^\n]*\))\n', tasks[rank] + '\n')
    assert said and said.group(1) == lines[rank % 2], tasks[rank][-2000:]


def _stand_in_nvidia_smi(folder):
  """A folder holding an `nvidia-smi -L` that lists 4 GPUs."""
  path = folder / 'bin' / 'nvidia-smi'
  path.parent.mkdir()
  path.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: stand-in '
                  '(UUID: GPU-$i)"; done\n')
  path.chmod(0o755)
  return path.parent


@pytest.mark.parametrize('said, tasks, requeued', [
    ('srun: error: slurmnode0: task 0: Exited with exit code 143\n'
     'srun: error: slurmnode1: task 1: Exited with exit code 143\n', 2, True),
    ('srun: error: slurmnode0: tasks 0-1,3: Exited with exit code 143\n'
     'srun: error: slurmnode1: task 2: Exited with exit code 143\n', 4, True),
    # A task that crashed beside one that stopped: srun returns 143 all
    # the same.
    ('srun: error: slurmnode0: task 0: Exited with exit code 143\n'
     'srun: error: slurmnode1: task 1: Exited with exit code 1\n', 2, False),
    ('srun: error: slurmnode1: task 1: Segmentation fault\n'
     'srun: error: slurmnode0: task 0: Exited with exit code 143\n', 2, False),
    # One that never said it stopped.
    ('srun: error: slurmnode0: task 0: Exited with exit code 143\n', 2, False),
])
def test_the_requeue_reads_every_tasks_exit(said, tasks, requeued, tmp_path):
  """The batch script's rule (its all_stopped, run by bash as it is in the
  script): requeue only where srun says every task exited 143."""
  script = open(os.path.join(REPO, 'launch', 'train.sbatch')).read()
  rule = re.search(r'^all_stopped\(\) \{\n.*?^\}\n', script,
                   re.M | re.S).group(0)
  (tmp_path / 'said').write_text(said)
  result = subprocess.run(['bash', '-c', f'{rule}\nall_stopped {tasks} '
                           f'{tmp_path / "said"}'], check=False)
  assert (result.returncode == 0) == requeued
