"""What a person sees, on a terminal and through a pipe.

Two real runs of the offline default (tiny), at once: one on a
pseudo-terminal, one into a pipe, the first preparing the bundled data set
anew. The terminal shows a live progress bar; the pipe gets no control
character. Neither shows the start-up and library noise a run used to print
(CUDA probing, tfds' preparation, checkpoint sharding timings, SavedModel
renaming notices); the workdir's run.log has the full log. A real warning
from TensorFlow's native code, and one from its Python side, still show.
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

from conftest import REPO

# The environment a user has: the tests' TF_CPP_MIN_LOG_LEVEL=2 would hide
# some of what is under test.
USER_ENV = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
NOISE = re.compile(r'cuda|cuInit|Downloading and preparing|Sharding callback|'
                   r'unsupported characters|absl::InitializeLog|oneDNN',
                   re.IGNORECASE)


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


def test_terminal_and_pipe_show_the_run_not_the_noise(tmp_path, tfds_dir):
  piped = subprocess.Popen(
      [sys.executable, '-m', 'launch.train',
       *_args(tmp_path / 'piped', tfds_dir)],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=USER_ENV)
  code, terminal = _on_a_terminal(_args(tmp_path / 'terminal',
                                        tmp_path / 'fresh_tfds'))
  out, err = piped.communicate(timeout=600)
  assert code == 0, terminal[-3000:]
  assert piped.returncode == 0, err[-3000:]

  # The terminal: the resolved run first, a live bar, then the lines.
  assert 'steps to 8' in terminal and '\r' in terminal
  lines = [l for l in terminal.replace('\r', '\n').splitlines() if l.strip()]
  assert lines[0].endswith('Prepared sklearn_digits (bundled with '
                           'scikit-learn) in ' +
                           f'{tmp_path}/fresh_tfds/sklearn_digits/1.0.0')
  assert re.match(r'\d\d:\d\d:\d\d Run: CPU', lines[1]), lines[:3]
  # The pipe: plain lines, the same short form.
  assert not re.search(r'[\x00-\x08\x0b-\x1f\x7f]', out + err)
  assert re.search(r'^\d\d:\d\d:\d\d step 8/8 \(epoch 2\.0\)', err, re.M)
  for text in (terminal, out + err):
    assert not NOISE.search(text), NOISE.search(text).group(0)
    assert 'Done: eval_accuracy' in text
  # The whole log, absl's format, in the workdir.
  log = (tmp_path / 'piped' / 'run.log').read_text()
  assert re.search(r'^I\d{4} [\d:.]+ +\d+ plan\.py:\d+\] Run: CPU', log, re.M)
  # A library's INFO lines (tfds reading its files) are kept here.
  assert re.search(r'^I\d{4} .* (reader|dataset_builder)\.py:\d+\] ', log,
                   re.M)


def test_real_tensorflow_warnings_still_show(tmp_path):
  """The filter is in place (the start-up noise is gone) and passes a real
  native warning and a Python-side one."""
  script = tmp_path / 'warns.py'
  script.write_text(
      'import sys\n'
      f'sys.path.insert(0, {REPO!r})\n'
      'from pipeline import environment\n'
      'environment.prepare(sys.argv)\n'
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
