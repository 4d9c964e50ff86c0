"""The prepared call for a lent GPU (launch.gpu_call) and what it leans on,
on this CPU where TensorFlow is absent, as on the lent machine: XLA's
autotune flags given to the pinned jaxlib, the probe's picks set before
XLA starts, the call at a tiny size to its last line, and its summary and
kernel classes read from what an H200 gave (tests/fixtures/h200/)."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

pytest.importorskip('jax', reason='needs JAX (the probe\'s environment)')

from conftest import REPO  # pylint: disable=g-import-not-at-top,wrong-import-position
from conftest import run_module  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import call_parts  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import call_summary  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import gpu_call  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.probe import picks  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.rules.speed import autotune  # pylint: disable=g-import-not-at-top,wrong-import-position

FIXTURES = os.path.join(REPO, 'tests', 'fixtures', 'h200')


def _convolve_with(xla_flags):
  return subprocess.run(
      [sys.executable, '-c', call_parts._TINY_CONVOLUTION],  # pylint: disable=protected-access
      capture_output=True, text=True, check=False, timeout=300,
      env=dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS='cpu'))


def test_each_autotune_flag_is_one_the_pinned_jaxlib_knows(tmp_path):
  """XLA aborts a process on a flag it does not know, whatever the device:
  every flag autotune.py gives XLA passes, in the process that compiles;
  a made-up one aborts the same way."""
  results = str(tmp_path / 'picks.textproto')
  flags = [f'{autotune.DUMP_FLAG}={results}',
           *autotune.flags(os.path.join(FIXTURES, 'autotune_dump.textproto'),
                           require_complete=True)]
  assert {flag.split('=')[0] for flag in flags} == set(autotune.FLAGS)
  done = _convolve_with(' '.join(flags))
  assert done.returncode == 0, done.stderr[-2000:]
  unknown = _convolve_with('--xla_gpu_load_autotune_results_form=x')
  assert unknown.returncode != 0
  assert 'xla_gpu_load_autotune_results_form' in unknown.stderr


def test_the_probe_sets_its_picks_before_xla_starts(tmp_path, monkeypatch):
  """Every probe process writes its picks; 'load' and 'require' add the
  saved ones for this card (require-complete too), 'fresh' does not;
  'require' with none saved is one line; without a GPU nothing loads."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  gpus = ['NVIDIA H200']
  environ = {}
  with pytest.raises(ValueError, match='no picks saved for NVIDIA H200'):
    picks.load(str(tmp_path / 'out'), 'require', environ, gpus)
  saved = autotune.save(os.path.join(FIXTURES, 'autotune_dump.textproto'),
                        'NVIDIA H200', picks.JaxBackend().software(),
                        'b0-224', {})
  assert saved
  loaded = picks.load(str(tmp_path / 'out'), 'require', environ, gpus)
  dump = f"{autotune.DUMP_FLAG}={tmp_path / 'out' / 'autotune.textproto'}"
  assert environ['XLA_FLAGS'] == ' '.join(
      [dump, *autotune.flags(loaded, require_complete=True)])
  fresh = {}
  assert picks.load(str(tmp_path / 'out'), 'fresh', fresh, gpus) is None
  assert fresh['XLA_FLAGS'] == dump
  assert picks.load(str(tmp_path / 'out'), 'require', {}, []) is None


def test_the_fastest_process_near_the_median_keeps_its_picks():
  rows = [('a', {'images_per_sec': 8011.0}, 'A'),
          ('b', {'images_per_sec': 8808.0}, 'B'),
          ('c', {'images_per_sec': 8843.0}, 'C'),
          ('d', {'failed': 'exit 1'}, 'D')]
  # The median is 8808: 8843 is within 2% and the fastest; 8011 is a slow
  # draw, never kept.
  assert picks.fastest_near_median(rows) == ('c', 'C')
  assert picks.fastest_near_median(rows[:1] + rows[2:3]) is None
  assert picks.fastest_near_median(rows[3:]) is None


def test_the_calls_summary_of_what_an_h200_gave():
  """The first call on an H200 (the picks not yet saved, so its loading
  parts stopped in one line): its figures as the summary reads them."""
  with open(os.path.join(FIXTURES, 'call_1.json'), encoding='utf-8') as f:
    parts = json.load(f)['steps']
  summary = call_summary.summarize(parts)
  assert summary['of_A'] == {'keras': round(8843.6 / 8011.4, 4)}
  assert summary['same_algorithms_as_A'] == {'keras': False}
  assert 'host_fed_of_keras_fit' not in summary  # Keras' fit was skipped.
  assert parts['B']['failed'].endswith('save them first with '
                                       '--save_autotune')


def _call(tmp_path, budget_s, compile_s=90.0):
  return call_parts.Call(
      str(tmp_path / 'out'), str(tmp_path / 'work'),
      call_parts.environment(str(tmp_path / 'cache')),
      ['--image_size=32', '--batch_size=8', '--num_classes=10',
       '--config.model=efficientnet_tiny'], [], compile_s,
      time.monotonic() + budget_s)


def test_a_part_that_cannot_fit_is_skipped_with_its_prediction(tmp_path):
  """B0's compile guessed at 90 s: the train part's three compiles and
  the rest of it need 390 s, and 300 are left."""
  call = _call(tmp_path, 310)
  record = gpu_call.run_part(call, gpu_call.PARTS[0])
  assert record['skipped'] == ('needs about 390 s (3 compile(s) at 90 s '
                               '(guessed) and 120 s); 300 s of the budget '
                               'left')
  assert record['predicted_s'] == 390
  assert not os.path.exists(tmp_path / 'work' / 'photos')
  call.measured_compile(20.0)  # Measured on this card: now it fits.
  assert call.predicted_s(gpu_call.PARTS[0]) == 180


def test_a_part_killed_by_its_watchdog_keeps_its_record(tmp_path):
  """A probe part predicted at 20 s and still timing at twice that: killed
  there, its record says so, with its exit code and its last line."""
  os.makedirs(tmp_path / 'work')
  call = _call(tmp_path, 600)
  part = gpu_call.Part('A', 'times far too many executions', 0, 20,
                       ('--stages=a', '--executions=100000'))
  record = gpu_call.run_part(call, part)
  assert record['stopped'] == 'watchdog'
  assert record['exit'] == -9  # SIGKILL, its whole session.
  assert any(line.startswith('probe: {"platform": "cpu"')
             for line in record['last_lines'])
  assert 38 <= record['seconds'] < 60
  # 15 s predicted fit the 20 s left, and the budget ends before 30 s.
  with_budget = _call(tmp_path, 30)
  part = gpu_call.Part('A', 'the same', 0, 15,
                       ('--stages=a', '--executions=100000'))
  assert gpu_call.run_part(with_budget, part)['stopped'] == 'budget'


def test_the_prepared_call_runs_to_its_last_line_on_this_cpu(tmp_path):
  """Every part at a tiny size: launch.train
  stopped by SIGTERM and resumed to its Done line, each probe process
  ending with its figures, OUT holding call.json and one archive, the
  caches outside it. No GPU autotunes here, so no picks are saved: the
  loading parts load none, and say nothing is required of them."""
  out, cache = tmp_path / 'call', tmp_path / 'cache'
  command = ('launch.gpu_call', f'--out={out}', '--budget_s=1500',
             f'--work_dir={tmp_path / "work"}', f'--cache_dir={cache}',
             '--compile_s=20', '--photos=64', '--train_steps=24',
             '--image_size=32', '--batch_size=8', '--executions=1',
             '--steps_per_execution=2', '--num_classes=10',
             '--config.model=efficientnet_tiny')
  result = run_module(*command, env={'KERAS_BACKEND': 'jax'}, timeout=1600)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  figures = json.loads((out / 'call.json').read_text())
  assert lines[0] == f'gpu_call: cache {cache}: empty (a fresh machine, or ' \
      'its first call): the picks and compiles are made anew'
  assert lines[-1] == (f'gpu_call: done in {figures["elapsed_s"]} s; '
                       f'{out}/call.json, {out}/call-files.tar.gz')
  assert sorted(os.listdir(out)) == ['call-files.tar.gz', 'call.json']
  parts = figures['parts']
  assert list(parts) == list(gpu_call.ORDER)
  for name, record in parts.items():
    assert record['exit'] == 0 and 'stopped' not in record, (name, record)
  train = parts['train']
  assert train['first']['stopped'] == ('SIGTERM after its first execution, '
                                       'as asked')
  assert train['resumed']['resumed_at_step'] > 0
  assert figures['summary']['train']['images_per_sec'] > 0
  assert parts['flags']['accepted']
  for name in ('A', 'B', 'C', 'keras'):
    assert parts[name]['stages']['a_device_rate']['images_per_sec'] > 0, name
  assert parts['keras']['stages']['f_keras_fit']['images_per_sec'] > 0
  summary = figures['summary']
  assert set(summary['of_A']) == {'B', 'C', 'keras'}
  assert summary['host_fed_of_keras_fit']['ratio'] > 0
  with tarfile.open(out / 'call-files.tar.gz') as tar:
    names = tar.getnames()
  assert {'train.log', 'A/probe.json', 'keras/probe.json'} <= set(names)
  # The next command on this machine finds what the first left.
  again = run_module(*command[:2], '--budget_s=60', '--steps=flags',
                     f'--work_dir={tmp_path / "work"}', f'--cache_dir={cache}',
                     env={'KERAS_BACKEND': 'jax'}, timeout=300)
  assert again.stdout.startswith(f'gpu_call: cache {cache}: '), again.stdout
  assert 'an earlier command on this machine left' in again.stdout



def test_command_parts_run_in_order_within_the_budget(tmp_path,
                                                      monkeypatch):
  """The checks' parts run a launcher as it is (stand-ins here, no GPU):
  in order, each record saying how it ended, its figures read back, one
  that overruns stopped at the budget, one that cannot fit skipped."""
  (tmp_path / 'in.json').write_text('{"images_per_sec": 7632}')
  commands = (
      gpu_call.Part('passes', 'a quick one', 0, 1,
                    command=('timeit', '-n', '1', 'pass')),
      gpu_call.Part('fails', 'reads a file that is not there', 0, 1,
                    command=('json.tool', '{work}/missing.json')),
      gpu_call.Part('writes', 'writes its figures', 0, 1,
                    command=('json.tool', str(tmp_path / 'in.json'),
                             '{work}/figures.json'), figures='figures.json'),
      gpu_call.Part('overruns', 'sleeps past the budget', 0, 20,
                    command=('timeit', '-n', '1',
                             'import time; time.sleep(60)')),
      gpu_call.Part('skipped', 'needs more than is left', 0, 1000,
                    command=('timeit', 'pass')),
  )
  monkeypatch.setattr(gpu_call, 'PARTS', commands)
  lines = []
  figures = gpu_call.run(str(tmp_path / 'out'), str(tmp_path / 'work'),
                         str(tmp_path / 'cache'), 40, [], [],
                         [part.name for part in commands],
                         report=lines.append)
  parts = figures['parts']
  assert list(parts) == ['passes', 'fails', 'writes', 'overruns', 'skipped']
  assert parts['passes']['exit'] == 0
  assert parts['fails']['exit'] == 2  # argparse's, for a missing file.
  assert parts['fails']['stopped'] == 'crash'
  assert 'missing.json' in '\n'.join(parts['fails']['last_lines'])
  assert parts['writes']['figures'] == {'images_per_sec': 7632}
  assert parts['overruns']['stopped'] == 'budget'
  assert parts['skipped']['skipped'].startswith('needs about 1000 s')
  assert figures['elapsed_s'] <= 41  # The budget, and the files' writing.
  assert json.loads((tmp_path / 'out' / 'call.json').read_text()) == figures
  assert lines[1].startswith('gpu_call: passes: ')


def test_the_checks_start_with_the_main_command_and_fit_their_budget():
  """--steps=checks on a GPU machine: launch.train on the JAX route first
  (it writes the photographs the others read), all within 2,700 s at B0's
  guessed compile time."""
  call = call_parts.Call('', '', {}, [], [], 90.0, 0.0)
  parts = {part.name: part for part in gpu_call.PARTS}
  assert gpu_call.CHECKS[0] == 'train' and set(gpu_call.CHECKS) <= set(parts)
  assert sum(call.predicted_s(parts[name])
             for name in gpu_call.CHECKS) <= 2700
