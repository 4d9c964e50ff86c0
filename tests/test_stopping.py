"""Stopping a run the ordinary ways: real processes, real signals.

Each process is started in a process group of its own, as a terminal or a
VM's init starts it, and the signals go to the whole group (`timeout`, a
shutdown, a terminal's Ctrl-C): the run and its console filter, a child
process, get them at once.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from conftest import REPO
from conftest import console_filter_of
from conftest import signal_once_it_prints
from conftest import tiny_args
from conftest import wait_until_gone
from pipeline.rules.machine import stopping

# A progress line: training is under way (the first follows the compile).
_PROGRESS = '(epoch '


def _start(module, *args):
  return subprocess.Popen(
      [sys.executable, '-m', module, *args], cwd=REPO,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
      process_group=0)


# Runs that a test stops: 2,000 steps of the tiny network (480 took 12 s
# here), so a signal sent after the first progress line lands mid-run
# however loaded the machine.
LONG_RUN_STEPS = 2000
_LONG_RUN = f'--config.epochs={LONG_RUN_STEPS // 8}'  # 8 steps an epoch.


def _start_train(workdir, tfds_dir):
  return _start('launch.train', *tiny_args(
      workdir, tfds_dir, _LONG_RUN, '--config.checkpoint_every_steps=1000'))


def _finish(process, head, console_filter):
  """(exit status, everything it wrote to stderr); its console filter gone
  with it, within the stated bound."""
  output = head + process.communicate(timeout=300)[1]
  wait_until_gone(console_filter, stopping.EXIT_BOUND_S)
  assert 'Traceback' not in output, output[-3000:]
  return process.returncode, output


def _read_until(process, text):
  """What `process` writes to stderr up to the first line holding `text`."""
  lines = []
  while not lines or text not in lines[-1]:
    lines.append(process.stderr.readline())
    assert lines[-1] or process.poll() is None, ''.join(lines)[-3000:]
  return ''.join(lines)


def _step(pattern, output):
  found = re.search(pattern, output)
  assert found, output[-3000:]
  return int(found.group(1))


@pytest.mark.slow  # Four runs, a minute and a half: CI's slow tier.
def test_a_run_stops_and_resumes_however_it_is_stopped(tmp_path, tfds_dir):
  workdir = str(tmp_path / 'run')
  newest = lambda: tf.train.latest_checkpoint(os.path.join(workdir,
                                                           'checkpoints'))

  # SIGTERM to the whole group, as `timeout -s TERM` and a VM's shutdown.
  run = _start_train(workdir, tfds_dir)
  console_filter = console_filter_of(run)
  head = signal_once_it_prints(run, _PROGRESS, signal.SIGTERM, group=True)
  code, output = _finish(run, head, console_filter)
  assert code == 143, output[-3000:]
  first = _step(r'\npreempted: SIGTERM: checkpoint of step (\d+) committed '
                f'to {re.escape(workdir)}; rerun the same command to resume\n',
                output)
  assert newest().endswith(f'ckpt-{first}')

  # The same command resumes there; Ctrl-C once saves and stops.
  run = _start_train(workdir, tfds_dir)
  console_filter = console_filter_of(run)
  head = signal_once_it_prints(run, _PROGRESS, signal.SIGINT, group=True)
  code, output = _finish(run, head, console_filter)
  assert code == 130, output[-3000:]
  assert f'Resuming at step {first} of {LONG_RUN_STEPS}' in output
  second = _step(r'WARNING: Ctrl-C: saving a checkpoint at step (\d+); '
                 r'Ctrl-C again to stop now\n', output)
  assert second > first
  assert (f'\nstopped: Ctrl-C: checkpoint of step {second} committed to '
          f'{workdir}; rerun the same command to resume\n') in output
  assert newest().endswith(f'ckpt-{second}')

  # Ctrl-C twice: at once, whatever the first had begun.
  run = _start_train(workdir, tfds_dir)
  console_filter = console_filter_of(run)
  head = signal_once_it_prints(run, _PROGRESS, signal.SIGINT, group=True,
                               times=2)
  code, output = _finish(run, head, console_filter)
  assert code == 130, output[-3000:]
  assert ('\nstopped: Ctrl-C again, at once; rerun the same command to '
          'resume from the last checkpoint committed to '
          f'{workdir}\n') in output
  last = int(newest().rsplit('-', 1)[1])
  assert last >= second

  # The last committed checkpoint restores. The console filter killed
  # mid-run: training goes on, and a later SIGTERM still ends in 143.
  run = _start_train(workdir, tfds_dir)
  console_filter = console_filter_of(run)
  head = _read_until(run, _PROGRESS)
  assert f'Resuming at step {last} of {LONG_RUN_STEPS}' in head
  os.kill(console_filter, signal.SIGKILL)
  head += signal_once_it_prints(run, _PROGRESS, signal.SIGTERM, group=True)
  code, output = _finish(run, head, console_filter)
  assert code == 143, output[-3000:]
  assert _step(r'preempted: SIGTERM: checkpoint of step (\d+)', output) > last


def test_native_lines_reach_the_terminal_after_the_filter_dies(tmp_path):
  """A process whose filter was killed: its next native write (to file
  descriptor 2) lands on the real stderr instead of raising, and telling
  the filter where its log is never raises either."""
  script = textwrap.dedent('''
      import os, signal, time
      from pipeline.run import environment
      environment.filter_native_stderr()
      os.write(2, b'through the filter\\n')
      time.sleep(2)  # Passed on before the filter is killed.
      child = open(f'/proc/{os.getpid()}/task/{os.getpid()}/children').read()
      os.kill(int(child.split()[0]), signal.SIGKILL)
      time.sleep(1)  # The watcher sees it end and takes the filter out.
      environment.native_lines_to('/tmp/ignored.log')
      os.write(2, b'straight to stderr\\n')
  ''')
  result = subprocess.run([sys.executable, '-c', script], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert result.stderr.splitlines()[-2:] == ['through the filter',
                                             'straight to stderr']


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_ctrl_c_stops_evaluate_follow_in_one_line(tmp_path, tfds_dir):
  """launch.evaluate --follow on a run that is not finished: Ctrl-C while
  it waits for the next checkpoint ends it in one line, naming what it
  evaluated."""
  workdir = str(tmp_path / 'run')
  run = _start_train(workdir, tfds_dir)
  signal_once_it_prints(run, _PROGRESS, signal.SIGTERM, group=True)
  run.communicate(timeout=300)
  assert run.returncode == 143
  step = int(tf.train.latest_checkpoint(
      os.path.join(workdir, 'checkpoints')).rsplit('-', 1)[1])

  follow = _start('launch.evaluate', f'--workdir={workdir}', '--follow',
                  '--poll_s=60')
  console_filter = console_filter_of(follow)
  head = signal_once_it_prints(follow, f'Evaluated step {step}',
                               signal.SIGINT, group=True)
  code, output = _finish(follow, head, console_filter)
  assert code == 130, output[-3000:]
  assert output.rstrip().endswith(
      f'stopped: Ctrl-C: evaluated 1 checkpoint(s) of {workdir}, steps '
      f'{step}'), output[-3000:]


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_ctrl_c_stops_a_comparison_and_its_run(tmp_path, tfds_dir):
  """launch.compare passes Ctrl-C on to the run in progress once: the run
  saves and stops, and the comparison says what finished."""
  root = tmp_path / 'compare'
  compare = _start('launch.compare', '--policies=float32,mixed_bfloat16',
                   *tiny_args(str(root), tfds_dir, _LONG_RUN)[1:],
                   f'--workdir={root}')
  log = root / 'float32' / 'train.log'
  deadline = time.time() + 300
  while not (log.exists() and _PROGRESS in log.read_text()):
    assert compare.poll() is None, compare.stderr.read()[-3000:]
    assert time.time() < deadline
    time.sleep(0.2)
  os.killpg(compare.pid, signal.SIGINT)
  output = compare.communicate(timeout=300)[1]
  assert compare.returncode == 130, output[-3000:]
  assert 'Traceback' not in output
  assert output.rstrip().splitlines()[-1] == (
      'stopped: Ctrl-C: finished runs: none; run float32 stopped (exit 130; '
      f'log: {log}); rerun the same command to go on')
  assert re.search(r'stopped: Ctrl-C: checkpoint of step \d+ committed',
                   log.read_text())
  assert not (root / 'mixed_bfloat16').exists()


def test_interrupting_the_notebook_cell_stops_its_run_with_a_checkpoint(
    tmp_path, tfds_dir):
  """The Colab notebook's run() in a stand-in kernel (a Python process
  given the cell's code): interrupting the kernel, as Jupyter's interrupt
  does, passes Ctrl-C on to the run once; it saves and stops, and the cell
  ends in one line."""
  kernel_code = textwrap.dedent('''
      # A kernel turns an interrupt into KeyboardInterrupt whatever it was
      # started with (a CI started in the background ignores SIGINT, and a
      # plain Python keeps that).
      import signal
      signal.signal(signal.SIGINT, signal.default_int_handler)
      import json, subprocess, sys  # The notebook's earlier cells import them.
      cells = json.load(open('notebooks/train_on_colab.ipynb'))['cells']
      exec(next(''.join(c['source']) for c in cells
                if ''.join(c['source']).startswith('import shlex')))
      run(sys.argv[1])
  ''')
  command = ' '.join(['launch.train', *tiny_args(
      str(tmp_path / 'run'), tfds_dir, _LONG_RUN)])
  kernel = subprocess.Popen([sys.executable, '-c', kernel_code, command],
                            cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            process_group=0)
  lines = []
  while not lines or _PROGRESS not in lines[-1]:
    lines.append(kernel.stdout.readline())
    assert lines[-1] or kernel.poll() is None, kernel.stderr.read()[-3000:]
  os.kill(kernel.pid, signal.SIGINT)  # The kernel alone, as Jupyter does.
  output, errors = kernel.communicate(timeout=300)
  output = ''.join(lines) + output
  assert re.search(r'\nstopped: Ctrl-C: checkpoint of step \d+ committed',
                   output), output[-3000:]
  assert errors.strip().splitlines() == [
      'Stopped; run the cell again to resume.'], errors[-3000:]
