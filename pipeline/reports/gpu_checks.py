"""What this project claims of GPUs, checked in order on one GPU machine
within a time budget, into one report: launch.gpu_checks.

Each check is a launcher run as its own process (a GPU run's process is
what a user runs), most decisive first: the JAX route alone (launch.probe),
then both backends on the same 224 px photographs, the input pipelines,
the compile cache, replicas with and without XLA, float16, and a whole
run on each backend. A check that would not end within what is left of
the budget is skipped with its reason; one that overruns is stopped at
the budget. The report (report.json, and report.txt for people) is
written after every check.
"""

import dataclasses
import json
import os
import sys
import time

from pipeline.probe import call_parts
from pipeline.launchers import Launcher
from pipeline import launchers


@dataclasses.dataclass(frozen=True)
class Check:
  name: str
  what: str
  args: tuple  # After `python -m`; {out} is the report's folder.
  needs_s: int  # What it takes on an H100, about: less left skips it.
  output: str = ''  # The JSON it writes under {out}, read into the report.


_PHOTOS = ('--config.dataset=tfrecord', '--config.train_files={out}/photos/train-*',
           '--config.eval_files={out}/photos/eval-*', '--config.num_classes=10',
           '--config.image_size=224', '--config.global_batch_size=256')

CHECKS = (
    Check('probe', 'the JAX route: compile, images/s on the device and fed '
          'from the host, memory, FLOPs, float16, Keras model.fit beside it',
          (Launcher.PROBE, '--out={out}/probe', '--budget_s=540'), 560,
          'probe/probe.json'),
    Check('photos', '4,096 photographs at ImageNet size as TFRecords',
          (Launcher.MAKE_TFRECORDS, '--dataset=photos', '--num_examples=4096',
           '--output_dir={out}/photos'), 120),
    Check('backends', 'both backends, B0 224 px batch 256: synthetic and '
          'real-input images/s, compile, overlap, FLOPs',
          (Launcher.BENCHMARK, '--backends=tensorflow,jax', *_PHOTOS,
           '--num_executions=10', '--output={out}/backends.json'), 600,
          'backends.json'),
    Check('input', 'tf.data against DALI on the same files',
          (Launcher.BENCHMARK, '--input_only', *_PHOTOS,
           '--output={out}/input.json'), 300, 'input.json'),
    Check('compile_cache', "a second process's compile time (the XLA "
          'cache)', (Launcher.BENCHMARK, '--backend=tensorflow', *_PHOTOS,
                     '--num_executions=2', '--output={out}/cached.json'), 240,
          'cached.json'),
    Check('replicas', 'two logical GPUs of one, XLA off and on',
          (Launcher.BENCHMARK, '--split_gpus=2', '--policies=mixed_bfloat16',
           '--xla_settings=off,on', *_PHOTOS, '--output={out}/replicas.json'),
          600, 'replicas.json'),
    Check('train_tensorflow', 'a whole default run on TensorFlow',
          (Launcher.TRAIN, '--backend=tensorflow',
           '--workdir={out}/train-tensorflow'), 300),
    Check('train_jax', 'a whole default run on JAX',
          (Launcher.TRAIN, '--backend=jax', '--workdir={out}/train-jax'),
          300),
)


def run(out, budget_s, checks=CHECKS, python=sys.executable):
  """Runs `checks` in order within `budget_s`; returns the report, which
  is also in `out`/report.json and report.txt after every check."""
  start = time.monotonic()
  report = {'budget_s': budget_s, 'checks': []}
  for check in checks:
    left_s = budget_s - (time.monotonic() - start)
    entry = {'name': check.name, 'what': check.what}
    if left_s < check.needs_s:
      entry['skipped'] = (f'{left_s:.0f} s of the budget left; it needs '
                          f'about {check.needs_s} s')
    else:
      entry.update(_run_one(check, out, left_s, python))
    report['checks'].append(entry)
    report['elapsed_s'] = round(time.monotonic() - start)
    _write(out, report)
    print(f'gpu_checks: {_line(entry)}', flush=True)
  return report


def _run_one(check, out, timeout_s, python):
  """One check's process (the probe's runner: its whole session stopped at
  the end of the budget), its output in OUT/NAME.log."""
  args = [arg.format(out=out) for arg in check.args]
  log = os.path.join(out, f'{check.name}.log')
  began = time.monotonic()
  exit_code, _, killed = call_parts.run_process(
      launchers.command(*args, python=python), dict(os.environ), timeout_s,
      log)
  entry = ({'exit': None, 'cut_off': 'stopped at the end of the budget'}
           if killed else {'exit': exit_code})
  with open(log, encoding='utf-8', errors='replace') as f:
    tail = f.read().splitlines()[-30:]
  entry.update(command=' '.join(['python -m', *args]),
               seconds=round(time.monotonic() - began), output_tail=tail)
  path = os.path.join(out, check.output) if check.output else ''
  if path and os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      entry['figures'] = json.load(f)
  return entry


def _line(entry):
  if 'skipped' in entry:
    return f"{entry['name']}: skipped ({entry['skipped']})"
  state = ('passed' if entry['exit'] == 0 else entry.get('cut_off') or
           f"failed with exit {entry['exit']}")
  return f"{entry['name']}: {state} in {entry['seconds']} s"


def _write(out, report):
  """report.json and report.txt, each replaced whole (a reader never sees
  half of one)."""
  lines = [f"GPU checks: {report['elapsed_s']} s of {report['budget_s']} s"]
  for entry in report['checks']:
    lines += ['', f"{_line(entry)}: {entry['what']}"]
    if 'command' in entry:
      lines += [f"  {entry['command']}"] + [
          f'  | {line}' for line in entry['output_tail'][-12:]]
  for name, text in (('report.json', json.dumps(report, indent=2)),
                     ('report.txt', '\n'.join(lines) + '\n')):
    path = os.path.join(out, name)
    with open(f'{path}.partial', 'w', encoding='utf-8') as f:
      f.write(text)
    os.replace(f'{path}.partial', path)
