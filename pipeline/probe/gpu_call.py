"""One prepared call for a lent GPU (launch.gpu_call): its parts in the
order of what is unknown, each started only where its predicted time fits
what the budget leaves.

  train    launch.train --backend=jax itself on the GPU, the main command
           never run there: ImageNet's recipe (configs/imagenet.py) on
           photographs written on the machine (launch.make_tfrecords
           --dataset=photos), stopped once by SIGTERM after its first
           execution and resumed to its Done line; its rate beside A's
  flags    XLA's autotune flags, each passed to this jaxlib on a tiny
           convolution (a flag it does not know aborts every process)
  A        the probe's stage (a), autotuning anew; its picks saved as soon
           as (a) has a rate (--save_autotune, nothing after it)
  B, C     (a) loading A's picks with require-complete (B also fed from
           the host (h), and its profile (g)): their spread, and the
           compile time the picks save against A's
  keras    (a) loading the picks, then Keras' own B0 with model.fit (f),
           its epochs alternating with (a)'s step timed again

`CHECKS` orders the whole project's claims on a user's GPU machine (about
45 minutes: `--steps=checks`): train, the whole probe, both backends on
those photographs, tf.data against DALI, the compile cache, replicas with
and without XLA, a whole run on TensorFlow.

A part's prediction is its compiles at the compile time measured so far
on this card (the train part's first, else --compile_s) and its fixed
seconds; a part that would not fit is skipped with that sum, and a running
one is stopped at twice its prediction (its watchdog) or at the end of
the budget. Every part leaves a record however it ends: its exit code,
its last lines, the stages it finished with their figures, and why it
stopped. OUT holds two files, call.json (rewritten after each part) and
call-files.tar.gz (each part's logs and probe.json, archived after each
part); the parts write under --work_dir, and the saved picks and compile
caches live under --cache_dir, outside OUT, where the next command on the
same machine finds them.
"""


import json
import os
import shutil
import tarfile
import time

from pipeline.probe import call_parts
from pipeline.probe import call_summary
from pipeline.launchers import Launcher

# A part runs at most this many times its prediction.
_WATCHDOG = 2.0

Part = call_parts.Part
PARTS = (
    Part('train', "launch.train --backend=jax, ImageNet's recipe on "
         'photographs written here; SIGTERM once, resumed to Done', 3, 120),
    Part('flags', "XLA's autotune flags on this jaxlib", 0, 20),
    Part('A', 'autotunes anew; its picks saved once (a) has a rate', 1, 30,
         ('--stages=a', '--save_autotune', '--keep_hlo')),
    Part('B', "loads A's picks, require-complete; fed from the host; "
         'profiled', 2, 40, ('--stages=ahg', '--autotune=require')),
    Part('C', "loads A's picks, require-complete", 1, 30,
         ('--stages=a', '--autotune=require')),
    Part('keras', "loads the picks; Keras' own model.fit", 2, 60,
         ('--stages=af', '--autotune=load')),
)
ORDER = tuple(part.name for part in PARTS)

_PHOTOS = ('--config.dataset=tfrecord', '--config.num_classes=10',
           '--config.train_files={work}/photos/train-*',
           '--config.eval_files={work}/photos/eval-*',
           '--config.image_size=224', '--config.global_batch_size=256')
PARTS += (
    Part('probe', 'the JAX route: compile, images/s on the device and fed '
         'from the host, memory, FLOPs, float16, Keras model.fit beside it',
         4, 180),
    Part('backends', 'both backends, B0 224 px batch 256: synthetic and '
         'real-input images/s, compile, overlap, FLOPs', 4, 240,
         command=(Launcher.BENCHMARK, '--backends=tensorflow,jax', *_PHOTOS,
                  '--num_executions=10', '--output={work}/backends.json'),
         figures='backends.json'),
    Part('input', 'tf.data against DALI on the same files', 0, 300,
         command=(Launcher.BENCHMARK, '--input_only', *_PHOTOS,
                  '--output={work}/input.json'), figures='input.json'),
    Part('compile_cache', "a second process's compile time (the XLA "
         'cache)', 1, 60,
         command=(Launcher.BENCHMARK, '--backend=tensorflow', *_PHOTOS,
                  '--num_executions=2', '--output={work}/cached.json'),
         figures='cached.json'),
    Part('replicas', 'two logical GPUs of one, XLA off and on', 2, 240,
         command=(Launcher.BENCHMARK, '--split_gpus=2',
                  '--policies=mixed_bfloat16', '--xla_settings=off,on',
                  *_PHOTOS, '--output={work}/replicas.json'),
         figures='replicas.json'),
    Part('train_tensorflow', 'a whole default run on TensorFlow', 2, 90,
         command=(Launcher.TRAIN, '--backend=tensorflow',
                  '--workdir={work}/train-tensorflow')),
)
# The whole project on a user's GPU machine, most decisive first.
CHECKS = ('train', 'probe', 'backends', 'input', 'compile_cache', 'replicas',
          'train_tensorflow')


def run_part(call, part):
  """`part`'s record: skipped with its prediction where it would not fit,
  else run under its watchdog."""
  predicted_s, left_s = call.predicted_s(part), call.left_s()
  basis = (f'{part.compiles} compile(s) at {call.compile_s:.0f} s '
           f"({'measured here' if call.measured else 'guessed'}) and "
           f'{part.fixed_s} s') if part.compiles else f'{part.fixed_s} s'
  record = {'what': part.what, 'predicted_s': round(predicted_s)}
  if predicted_s > left_s:
    return dict(record, skipped=f'needs about {predicted_s:.0f} s '
                f'({basis}); {max(left_s, 0):.0f} s of the budget left')
  watchdog_s = _WATCHDOG * predicted_s
  timeout_s = min(watchdog_s, left_s)
  # What a kill at timeout_s means.
  why = 'watchdog' if watchdog_s <= left_s else 'budget'
  began = time.monotonic()
  if part.name == 'train':
    record.update(call_parts.run_train(call, timeout_s, why))
  elif part.name == 'flags':
    record.update(call_parts.check_flags(call, timeout_s))
  elif part.command:
    record.update(call_parts.run_command(call, part, timeout_s, why))
  else:
    record.update(call_parts.run_probe(call, part, timeout_s, why))
  record['seconds'] = round(time.monotonic() - began, 1)
  return record


def run(out, work, cache_dir, budget_s, probe_flags, train_flags, order=ORDER,
        compile_s=90.0, photos=1024, report=print):
  """The call: the parts named in `order`, in that order; its figures
  (OUT/call.json, and the parts' files in OUT/call-files.tar.gz)."""
  os.makedirs(out, exist_ok=True)
  shutil.rmtree(work, ignore_errors=True)  # An earlier call's files.
  os.makedirs(work)
  call = call_parts.Call(out, work, call_parts.environment(cache_dir),
                         list(probe_flags), list(train_flags), compile_s,
                         time.monotonic() + budget_s, photos)
  began = time.monotonic()
  figures = {'budget_s': budget_s, 'cache': call_parts.cache_state(cache_dir),
             'probe_flags': list(probe_flags), 'parts': {}}
  report(f"gpu_call: cache {figures['cache']}")
  parts = {part.name: part for part in PARTS}
  for name in order:
    record = run_part(call, parts[name])
    figures['parts'][name] = record
    figures['elapsed_s'] = round(time.monotonic() - began, 1)
    figures['summary'] = call_summary.summarize(figures['parts'])
    _save(out, work, figures)
    report(f'gpu_call: {name}: {call_summary.brief(record)}')
  for line in call_summary.summary_lines(figures['summary']):
    report(f'gpu_call: {line}')
  return figures


def _save(out, work, figures):
  """call.json and the archive of the parts' files, each replaced whole."""
  path = os.path.join(out, 'call.json')
  with open(f'{path}.partial', 'w', encoding='utf-8') as f:
    json.dump(figures, f, indent=2)
  os.replace(f'{path}.partial', path)
  archive = os.path.join(out, 'call-files.tar.gz')
  with tarfile.open(f'{archive}.partial', 'w:gz') as tar:
    for name in sorted(os.listdir(work)):
      if name != 'photos':  # Made here, made again: not figures.
        tar.add(os.path.join(work, name), arcname=name)
  os.replace(f'{archive}.partial', archive)


