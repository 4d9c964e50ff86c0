"""How each part of launch.gpu_call runs (pipeline/probe/gpu_call.py
orders them): in a process of its own, in its own session so a watchdog
kills all of it, its output kept in a log beside its figures, and a record
of how it ended, whatever the ending.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

from pipeline.rules.speed import autotune
from pipeline.launchers import Launcher
from pipeline import launchers

# Seconds kept back so the call ends within its budget.
_MARGIN_S = 10
# Lines of a part's output its record keeps.
_LAST_LINES = 6

_TINY_CONVOLUTION = """
import jax, jax.numpy as jnp
x = jnp.ones((8, 16, 16, 32), jnp.bfloat16)
w = jnp.ones((3, 3, 1, 32), jnp.bfloat16)
f = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
    x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
    feature_group_count=32))
print(float(f(x, w).astype(jnp.float32).sum()))
"""


@dataclasses.dataclass(frozen=True)
class Part:
  name: str
  what: str
  # Programs of the step's size it compiles, and its other seconds
  # (process starts, the photographs, timing): its prediction.
  compiles: int
  fixed_s: int
  probe_flags: tuple = ()  # launch.probe's, for a part that is a probe.
  # A launcher and its arguments ({work}: the work folder), for a part that
  # runs one as it is, and the JSON file there its figures are read from.
  command: tuple = ()
  figures: str = ''


@dataclasses.dataclass
class Call:
  """What the parts share: where they write, their environment, the
  compile time measured so far, the budget's end."""
  out: str
  work: str
  env: dict
  probe_flags: list
  train_flags: list
  compile_s: float
  deadline: float
  photos: int = 1024  # The train part's photographs.
  measured: bool = False  # Whether compile_s was measured on this card.

  def left_s(self):
    return self.deadline - time.monotonic() - _MARGIN_S

  def predicted_s(self, part):
    return part.fixed_s + part.compiles * self.compile_s

  def measured_compile(self, seconds):
    """A compile time measured on this card: the estimate follows the
    slowest seen so far."""
    if seconds:
      self.compile_s = max(seconds, self.compile_s if self.measured else 0)
      self.measured = True


def environment(cache_dir):
  """The parts' environment: picks and compile caches under `cache_dir`
  (XDG_CACHE_HOME), outside OUT."""
  env = dict(os.environ, XDG_CACHE_HOME=cache_dir, PYTHONUNBUFFERED='1')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


def cache_state(cache_dir):
  """One line: what an earlier command left in `cache_dir`."""
  found = [os.path.join(root, name) for root, _, names in
           os.walk(cache_dir) for name in names] if os.path.isdir(
               cache_dir) else []
  if not found:
    return (f'{cache_dir}: empty (a fresh machine, or its first call): '
            'the picks and compiles are made anew')
  return (f'{cache_dir}: {len(found)} files an earlier command on this '
          'machine left (saved picks, compiled programs)')


def run_process(args, env, timeout_s, log_path, on_line=None):
  """Runs `args` in a session of its own, its output to `log_path`;
  `on_line(line, process)` sees each line. (exit code, last lines, True
  where it was killed at `timeout_s`)."""
  with open(log_path, 'a', encoding='utf-8') as log:
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    killed = threading.Event()

    def kill():
      killed.set()
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

    timer = threading.Timer(max(timeout_s, 1), kill)
    timer.start()
    last = []
    try:
      for line in process.stdout:
        log.write(line)
        last = (last + [line.rstrip()])[-_LAST_LINES:]
        if on_line:
          on_line(line, process)
      process.wait()
    finally:
      timer.cancel()
  return process.returncode, last, killed.is_set()


def _ended(record, exit_code, last, killed, why):
  """`record` with how its process ended; `why`: what a kill means."""
  record.update(exit=exit_code, last_lines=last)
  if killed:
    record['stopped'] = why
  elif exit_code:
    record['stopped'] = 'crash'
  return record


def run_probe(call, part, timeout_s, why):
  """A probe part: launch.probe in its folder; its stages and variants,
  those it finished before any stop included."""
  folder = os.path.join(call.work, part.name)
  args = launchers.command(Launcher.PROBE, *call.probe_flags,
                           *part.probe_flags, f'--out={folder}',
                           f'--budget_s={int(timeout_s)}')
  record = {'command': ' '.join(args[1:])}
  ended = run_process(args, call.env, timeout_s,
                      os.path.join(call.work, f'{part.name}.log'))
  _ended(record, *ended, why)
  try:
    with open(os.path.join(folder, 'probe.json'), encoding='utf-8') as f:
      written = json.load(f)
  except (OSError, ValueError):
    written = {}
  record['stages'] = written.get('stages', {})
  if written.get('variants'):
    record['variants'] = written['variants']
  record['noisy_timing_lines'] = _count(
      os.path.join(call.work, f'{part.name}.log'), autotune.NOISY_TIMING)
  call.measured_compile(record['stages'].get('a_device_rate', {}).get(
      'compile_s'))
  return record


def run_command(call, part, timeout_s, why):
  """A command part: its launcher run as it is; its figures, where its
  file was written."""
  args = launchers.command(*(arg.format(work=call.work)
                             for arg in part.command))
  record = _ended({'command': ' '.join(args[1:])}, *run_process(
      args, call.env, timeout_s, os.path.join(call.work, f'{part.name}.log')),
                  why)
  path = os.path.join(call.work, part.figures) if part.figures else ''
  if path and os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      record['figures'] = json.load(f)
  return record


def _count(path, text):
  with open(path, encoding='utf-8', errors='replace') as f:
    return f.read().count(text)


def run_train(call, timeout_s, why):
  """The train part: photographs, a run stopped by SIGTERM after its first
  execution, the same command resumed to its Done line."""
  photos, workdir = (os.path.join(call.work, name) for name in
                     ('photos', 'train'))
  log = os.path.join(call.work, 'train.log')
  end = time.monotonic() + timeout_s
  record = {}
  written = run_process(
      launchers.command(Launcher.MAKE_TFRECORDS, '--dataset=photos',
                        f'--output_dir={photos}',
                        f'--num_examples={call.photos}'),
      call.env, timeout_s, log)
  record['photos'] = _ended({}, *written, why)
  if written[0]:
    return dict(record, **{k: record['photos'][k] for k in (
        'exit', 'last_lines', 'stopped') if k in record['photos']})
  args = [*launchers.command(Launcher.TRAIN), '--backend=jax',
          '--config=configs/imagenet.py', '--policy=mixed_bfloat16',
          '--config.dataset=tfrecord', '--config.num_classes=10',
          f'--config.train_files={photos}/train-*',
          f'--config.eval_files={photos}/eval-*', f'--workdir={workdir}',
          # Kept for the resumed run and the next call (on a CPU too).
          '--config.compile_cache_dir=' + os.path.join(
              call.env['XDG_CACHE_HOME'], 'compiles'),
          *call.train_flags]
  record['command'] = ' '.join(args[1:])
  for run in ('first', 'resumed'):
    figures = {}

    def watch(line, process, run=run, figures=figures):
      if 'First execution (tracing and compiling included)' in line:
        figures['compile_s'] = float(line.rsplit(':', 1)[1].split()[0])
        if run == 'first':
          process.send_signal(signal.SIGTERM)  # As a preemption would.
      elif 'Resuming at step' in line:
        figures['resumed_at_step'] = int(line.split('Resuming at step')[1]
                                         .split()[0])
      elif 'Done:' in line:
        figures['done'] = line.split('Done:', 1)[1].strip()
        rate = [w for w in figures['done'].split(', ') if w.endswith(
            'img/s')]
        if rate:
          figures['images_per_sec'] = float(
              rate[0].split()[0].replace(',', ''))

    ended = run_process(args, call.env, end - time.monotonic(), log, watch)
    record[run] = _ended(figures, *ended, why)
    if run == 'first':
      call.measured_compile(figures.get('compile_s'))
      if 'compile_s' not in figures or ended[2]:
        break  # It never reached its SIGTERM, or was killed.
      figures['stopped'] = 'SIGTERM after its first execution, as asked'
  last = record.get('resumed', record['first'])
  record.update({k: last[k] for k in ('exit', 'last_lines', 'stopped')
                 if k in last})
  return record


def check_flags(call, timeout_s):
  """Each of autotune.FLAGS given to this jaxlib on a tiny convolution:
  written, then loaded with require-complete."""
  results = os.path.join(call.work, 'flags', 'picks.textproto')
  os.makedirs(os.path.dirname(results), exist_ok=True)
  record = {}
  for name, xla_flags in (
      ('dump', [f'{autotune.DUMP_FLAG}={results}']),
      ('load_require_complete', autotune.flags(results, True))):
    env = dict(call.env, XLA_FLAGS=autotune.with_flags(
        call.env.get('XLA_FLAGS'), xla_flags))
    exit_code, last, _ = run_process(
        [sys.executable, '-c', _TINY_CONVOLUTION], env, timeout_s / 2,
        os.path.join(call.work, 'flags.log'))
    record[name] = {'exit': exit_code, 'last_lines': last}
  record['results_written'] = os.path.exists(results)
  record['accepted'] = all(record[n]['exit'] == 0 for n in
                           ('dump', 'load_require_complete'))
  record['exit'] = 0 if record['accepted'] else 1
  failed = [record[n] for n in ('dump', 'load_require_complete')
            if record[n]['exit']]
  if failed:
    record['last_lines'] = failed[0]['last_lines']
  return record
