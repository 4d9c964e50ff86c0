"""What a person sees on a terminal; and real warnings still showing.

A real run of the offline default (tiny) on a pseudo-terminal, preparing
the bundled data set anew, shows a live progress bar and none of the
start-up and library noise a run used to print (CUDA probing, tfds'
preparation, checkpoint sharding timings, SavedModel renaming notices).
The same checks through a pipe ride on tests/test_train_e2e.py's run. A
real warning from TensorFlow's native code, and one from its Python side,
still show.
"""

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest

from conftest import REPO
from conftest import xla_on_cpu

# The environment a user has: the tests' TF_CPP_MIN_LOG_LEVEL=2 would hide
# some of what is under test.
USER_ENV = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
NOISE = re.compile(r'cuda|cuInit|Downloading and preparing|Sharding callback|'
                   r'unsupported characters|absl::InitializeLog|oneDNN',
                   re.IGNORECASE)
# An INFO line in absl's format (Python's or native code's): run.log gets
# these, the console never. Issue 26 saw launch.benchmark print the plan
# this way on a GPU, from a version that did not set up the console.
ABSL_INFO = re.compile(r'^I\d{4} \d\d:\d\d:\d\d', re.M)
# A launcher's path, as argv[0] of a script that starts as launchers do.
LAUNCHER = os.path.join(REPO, 'launch', 'train.py')


def _on_a_terminal(args):
  """Runs `python -m launch.train ARGS` on a pseudo-terminal; its output."""
  parent, child = pty.openpty()
  # A terminal 100 columns wide (a fresh pseudo-terminal has 0).
  fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack('HHHH', 30, 100, 0, 0))
  process = subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                             cwd=REPO, stdin=child, stdout=child, stderr=child,
                             close_fds=True, env=USER_ENV)
  os.close(child)
  output = b''
  while True:
    ready, _, _ = select.select([parent], [], [], 600)
    try:
      chunk = os.read(parent, 65536) if ready else b''
    except OSError:  # The terminal closed: the process ended.
      chunk = b''
    if not chunk:
      break
    output += chunk
  process.wait(timeout=60)
  os.close(parent)
  return process.returncode, output.decode('utf-8', 'replace')


def _args(workdir, data_dir):
  return [f'--workdir={workdir}', f'--config.data_dir={data_dir}',
          '--config.train_split=train[:128]', '--config.epochs=2',
          '--config.global_batch_size=32', '--config.steps_per_execution=1',
          '--config.log_every_steps=8', '--config.eval_every_epochs=0']


# A whole training run on a terminal (48 s): the slow tier keeps the fast
# suite in 15 min; the pipe half rides on tests/test_train_e2e.py.
@pytest.mark.slow
def test_a_terminal_shows_the_run_and_a_live_bar(tmp_path):
  """On a pseudo-terminal, preparing the bundled data set anew: the first
  lines are the run's, a bar moves between summary lines, and none of the
  noise shows. (The same run into a pipe: tests/test_train_e2e.py.)"""
  code, terminal = _on_a_terminal(
      [f'--workdir={tmp_path / "run"}',
       f'--config.data_dir={tmp_path / "fresh_tfds"}',
       '--config.model=efficientnet_tiny',
       '--config.train_split=train[:128]', '--config.epochs=2',
       '--config.global_batch_size=32', '--config.steps_per_execution=1',
       '--config.log_every_steps=8', '--config.eval_every_epochs=0'])
  assert code == 0, terminal[-3000:]
  assert 'steps to 8' in terminal and '\r' in terminal
  lines = [l for l in terminal.replace('\r', '\n').splitlines() if l.strip()]
  # The backend's line first (it is chosen before anything loads), then
  # the data's preparation, then the rest of the plan.
  assert re.match(r'\d\d:\d\d:\d\d Backend: tensorflow \(no TPU',
                  lines[0]), lines[:3]
  assert lines[1].endswith('Prepared sklearn_digits (bundled with '
                           'scikit-learn) in ' +
                           f'{tmp_path}/fresh_tfds/sklearn_digits/1.0.0')
  assert re.match(r'\d\d:\d\d:\d\d Run: CPU', lines[2]), lines[:3]
  assert not NOISE.search(terminal), NOISE.search(terminal).group(0)
  assert 'Done: eval_accuracy' in terminal


def test_real_tensorflow_warnings_still_show(tmp_path):
  """The filter is in place (the start-up noise is gone) and passes a real
  native warning and a Python-side one."""
  script = tmp_path / 'warns.py'
  script.write_text(
      'import sys\n'
      f'sys.path.insert(0, {REPO!r})\n'
      'from pipeline.run import environment\n'
      '# What a launcher run as a program does before TensorFlow loads\n'
      '# (a path in launch/ is what puts the filter in place).\n'
      f'environment.prepare([{LAUNCHER!r}])\n'
      'import tensorflow as tf\n'
      '# Native: a cache that is not read to its end.\n'
      'list(tf.data.Dataset.range(10).cache().take(2))\n'
      "tf.get_logger().warning('a TensorFlow warning from Python')\n")
  result = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, check=False, env=USER_ENV)
  assert result.returncode == 0, result.stderr
  assert 'did not fully read the dataset being cached' in result.stderr
  assert 'a TensorFlow warning from Python' in result.stderr
  assert not NOISE.search(result.stderr), result.stderr


def test_native_lines_about_the_run_go_to_the_log_file_only(tmp_path):
  """XLA ignoring an assert (real, from a compiled tf.debugging assert; the
  TPU build, which has no XLA CPU backend, writes it as XLA would), two
  lines a GPU prints (written as its native code would: no GPU here) and
  the JPEG decoder's lines on damaged images (real) reach run.log and not
  the console; other lines still show."""
  log = tmp_path / 'run.log'
  compile_an_assert = (
      '@tf.function(jit_compile=True)\n'
      'def f(x):\n'
      '  with tf.control_dependencies([tf.debugging.assert_non_negative(x)]):\n'
      '    return x + 1\n'
      'f(tf.ones(3))  # Before the log file: kept, then written.\n'
      if xla_on_cpu() else
      "os.write(2, b'W0000 00:00:1763900000.0 123 assert_op.cc:39] Ignoring "
      "Assert operator assert_non_negative/assert_less_equal/Assert/Assert"
      "\\n')\n")
  gpu_lines = (
      'E0000 00:00:1763900000.1 123 cuda_timer.cc:87] Delay kernel timed '
      'out: measured time has sub-optimal accuracy.\n'
      'E0000 00:00:1763900000.2 123 text_format.cc:378] Error parsing '
      'text-format tensorflow.XlaSerializedCacheEntry: 2:1: Expected '
      'identifier, got: 5\n')
  damaged_images = (  # TensorFlow's and libjpeg's own lines.
      'jpeg = tf.io.encode_jpeg(tf.zeros([64, 64, 3], tf.uint8)).numpy()\n'
      'for read, data in ((tf.io.decode_jpeg, jpeg[:len(jpeg) // 2]),\n'
      '                   (tf.io.decode_jpeg, jpeg[:-2]),\n'
      "                   (tf.image.extract_jpeg_shape, b'\\xff\\xd8 cut')):\n"
      '  try:\n'
      '    read(data)\n'
      '  except tf.errors.InvalidArgumentError:\n'
      '    pass\n')
  script = tmp_path / 'quiet.py'
  script.write_text(
      'import os, sys\n'
      f'sys.path.insert(0, {REPO!r})\n'
      'from pipeline.run import environment\n'
      f'environment.prepare([{LAUNCHER!r}])\n'
      'import tensorflow as tf\n'
      + compile_an_assert +
      f'environment.native_lines_to({str(log)!r})\n'
      f'os.write(2, {gpu_lines.encode()!r})\n'
      + damaged_images +
      "os.write(2, b'W0000 a native line about something else\\n')\n"
      "environment.native_lines_to('')\n")
  result = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, check=False, env=USER_ENV)
  assert result.returncode == 0, result.stderr
  kept = log.read_text()
  for line in ('assert_op.cc', 'cuda_timer.cc:87', 'text_format.cc:378',
               'Premature end of JPEG data', 'Improper call to JPEG library',
               'Input file read error'):
    assert line not in result.stderr, result.stderr
    assert line in kept
  assert 'Ignoring Assert operator' in kept
  assert 'a native line about something else' in result.stderr
  assert 'something else' not in kept


@pytest.mark.parametrize('total_steps, points', [
    (8, 8), (200, 200), (201, 101), (399, 200), (400, 200), (401, 134),
    (218_949, 200)])
def test_the_loss_curve_has_at_most_200_points(total_steps, points):
  from pipeline.training import progress  # pylint: disable=g-import-not-at-top
  every = progress.curve_every(total_steps)
  steps = [s for s in range(1, total_steps + 1)
           if s % every == 0 or s == total_steps]
  assert len(steps) == points


@pytest.mark.parametrize('step, every, per_step, says', [
    (4, 0, None, 'time left: estimating'),
    # 96 steps of 1.25 s left; no periodic evaluation: the next is the last.
    (4, 0, 1.25, '2m 00s left, next eval in 2m 00s'),
    (4, 10, 1.25, '2m 00s left, next eval in 8s'),
    (10, 10, 1.25, '1m 52s left, next eval in 12s'),
    (95, 10, 1.25, '6s left, next eval in 6s'),  # The last is the 100th.
    (4, 10, 60.0, '1h 36m left, next eval in 6m 00s'),
    (100, 10, 1.25, 'final eval next'),
])
def test_the_time_left_to_the_end_and_the_next_evaluation(step, every,
                                                          per_step, says):
  from pipeline.training import progress  # pylint: disable=g-import-not-at-top
  times = progress.StepTimes(_stages((0, 100, 64)))
  if per_step is not None:
    times.add(0, 8, 8 * per_step)
  assert progress.time_left(step, 100, every, times.seconds) == says


def _stages(*spans):
  from pipeline.recipe import progressive  # pylint: disable=g-import-not-at-top
  return tuple(progressive.Stage(index, first, end, size, 0.0, 0.0, 0.0)
               for index, (first, end, size) in enumerate(spans))


def test_the_time_left_of_a_progressive_run_counts_its_larger_stages():
  """A first stage at 32 px must not promise the end at its speed: the
  64 px stage ahead is taken as 4x its step (the pixels) until measured."""
  from pipeline.training import progress  # pylint: disable=g-import-not-at-top
  times = progress.StepTimes(_stages((0, 50, 32), (50, 100, 64)))
  times.add(0, 10, 1.0)  # 0.1 s a step at 32 px.
  # 40 steps at 0.1 s, then 50 at 0.4 s: 24 s, not 9.
  assert progress.time_left(10, 100, 0, times.seconds) == (
      '24s left, next eval in 24s')
  assert progress.time_left(10, 100, 20, times.seconds) == (
      '24s left, next eval in 1s')
  times.add(50, 10, 3.0)  # Measured: 0.3 s a step at 64 px.
  assert progress.time_left(60, 100, 0, times.seconds) == (
      '12s left, next eval in 12s')


def test_the_meter_times_steps_without_the_compiling_execution():
  from pipeline.training import progress  # pylint: disable=g-import-not-at-top
  meter = progress.Meter(global_batch_size=8)
  meter.add(4, 30.0, 0.0)  # Traced and compiled: not a step's time.
  assert meter.overall() == (None, None)
  meter.add(4, 2.0, 0.5)
  meter.add(2, 1.0, 0.0)
  meter.add(2, 9.0, 0.0, compiled=True)  # A stage's first, at a new size.
  assert meter.overall() == (6 * 8 / 3.0, 0.5 / 3.0)


def test_the_readme_sample_is_what_the_default_run_prints(tmp_path, tfds_dir):
  """The plan lines under README's "What a run does" against a dry run of
  the same command today: equal, but for the time, the workdir, the free
  memory and the versions (the TPU build runs this too). The sample is a
  CPU's without 16-bit units; on one with them (AMX, AVX-512 BF16) the
  precision line is the one the README gives for it, naming its units."""
  from conftest import run_train  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'README.md')) as f:
    readme = f.read()
  sample = readme.split('## What a run does', 1)[1].split('```')[1]
  normal = lambda lines: [
      re.sub(r'[\d.]+ GiB free', 'N GiB free', re.sub(
          r'^(Workdir|Software): .*', r'\1: -', line.split(' ', 1)[1]))
      for line in lines if re.match(r'\d\d:\d\d:\d\d [A-Z][A-Za-z]+: ', line)
      and not line.split(' ', 1)[1].startswith(('Done:', 'Eval at'))]
  result = run_train(f'--workdir={tmp_path / "run"}',
                     f'--config.data_dir={tfds_dir}', '--dry_run')
  assert result.returncode == 0, result.stderr[-2000:]
  expected = normal(sample.strip().splitlines())
  assert len(expected) == 10 and expected[0].startswith('Backend: tensorflow')
  from pipeline.rules.speed import precision  # pylint: disable=g-import-not-at-top
  units = precision.cpu_info()[1]
  if units:
    line = re.search(r'the precision line reads `(Precision: [^`]*)`',
                     ' '.join(readme.split()))
    assert line, 'README gives no precision line for a CPU with 16-bit units'
    expected[3] = line.group(1).replace('UNITS', ', '.join(units))
  assert normal(result.stderr.splitlines()) == expected
