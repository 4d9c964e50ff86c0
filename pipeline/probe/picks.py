"""XLA's convolution picks in the probe (rules/speed/autotune.py holds the
rule): what each process writes and loads before XLA starts, what its
compiled step runs against the saved picks, and which process's picks
are kept (`--save_autotune`: the fastest within autotune.FASTEST of the
median, never a slow draw)."""

import hashlib
import json
import os
import statistics

from pipeline.backends.jax import JaxBackend
from pipeline.rules.machine import probes
from pipeline.rules.speed import autotune


# Where each probe process writes the autotuner's picks (a GPU's XLA
# writes them as it compiles; elsewhere there are none).
AUTOTUNE_FILE = 'autotune.textproto'


def card(device_kind=None, gpus=None):
  """The card the picks are kept for: the driver's name for it, which a run
  reads before JAX loads (`device_kind`, JAX's, where the driver names
  none)."""
  gpus = probes.gpu_models() if gpus is None else gpus
  return gpus[0] if gpus else device_kind


def load(out_dir, mode, environ=None, gpus=None):
  """Before JAX starts XLA: this process writes its picks into `out_dir`
  and loads those saved for this card and software as `mode` asks
  (autotune.prepare). Returns the loaded file's path, or None. `gpus`
  stands in for the driver's list (tests)."""
  gpus = probes.gpu_models() if gpus is None else gpus
  software = JaxBackend().software() if gpus else None
  if gpus and mode != 'fresh':
    print(f'probe: autotune picks for {card(gpus=gpus)} and {software}',
          flush=True)
  loaded, passed_over = autotune.prepare(
      card(gpus=gpus), software, os.environ if environ is None else environ,
      mode, write_to=os.path.join(out_dir, AUTOTUNE_FILE))
  for line in passed_over:
    print(f'probe: {line}', flush=True)
  return loaded


def fastest_near_median(processes):
  """(label, folder) of the fastest of [(label, figures, folder)] within
  autotune.FASTEST of their median rate (a fast draw, not a fluke), or
  None where none was timed or lies that near."""
  timed = [row for row in processes if 'images_per_sec' in row[1]]
  if not timed:
    return None
  median = statistics.median(r[1]['images_per_sec'] for r in timed)
  near = [row for row in timed if abs(row[1]['images_per_sec'] / median - 1)
          <= autotune.FASTEST]
  if not near:  # Two processes far apart: neither is the typical draw.
    return None
  label, _, folder = max(near, key=lambda row: row[1]['images_per_sec'])
  return label, folder


# Where stage (a) lists its compiled step's convolutions and algorithms.
CONVOLUTIONS_FILE = 'convolutions.json'


def convolution_picks(probe, text):
  """The algorithms the compiled step (its HLO `text`) runs its cuDNN
  convolutions with: their count and a digest (two processes that agree
  run the same kernels), each kept in OUT/convolutions.json (the text in
  OUT/step.hlo.txt with --keep_hlo); against the saved picks where XLA
  loaded some."""
  found = autotune.compiled_convolutions(text)
  listed = json.dumps(found, sort_keys=True)
  figures = {'convolutions': sum(map(len, found.values())),
             'convolution_algorithms_sha256':
                 hashlib.sha256(listed.encode()).hexdigest()[:16]}
  if probe.out_dir:
    with open(os.path.join(probe.out_dir, CONVOLUTIONS_FILE), 'w',
              encoding='utf-8') as f:
      f.write(listed)
    if probe.keep_hlo:
      with open(os.path.join(probe.out_dir, 'step.hlo.txt'), 'w',
                encoding='utf-8') as f:
        f.write(text)
  if probe.loaded_picks:
    counts = autotune.differing_picks(
        text, autotune.saved_convolutions(probe.loaded_picks))
    figures['kernel_picks'] = dict(counts, line=autotune.picks_line(
        counts, probe.loaded_picks))
  return figures


def save_autotune(results, step_key, out_dir):
  """Keeps the autotune picks of the fastest process within
  autotune.FASTEST of the median (this one alone without --repeats) for
  this card, software and step (`step_key(devices, policy)`: the step's
  name, saved_rate.step_key of the probe's config), which every later
  process on the JAX route loads; returns what it did, in a line."""
  machine_, stages = results['machine'], results['stages']
  if machine_['platform'] != 'gpu':
    return 'no picks saved: only a GPU autotunes its convolutions'
  if 'repeats' in results:
    chosen = results['repeats'].get('fastest_near_median')
  else:
    chosen = (('this process', out_dir) if 'images_per_sec' in
              stages.get('a_device_rate', {}) else None)
  if not chosen:
    return ('no picks saved: no process timed stage a within '
            f'{autotune.FASTEST:.0%} of the median')
  label, folder = chosen
  key = step_key(machine_['devices'], stages['a_device_rate']['policy'])
  try:
    with open(os.path.join(folder, CONVOLUTIONS_FILE),
              encoding='utf-8') as f:
      convolutions = json.load(f)
    target = autotune.save(
        os.path.join(folder, AUTOTUNE_FILE),
        card(machine_['device_kind']), JaxBackend().software(),
        key, convolutions)
  except (OSError, ValueError) as e:
    return f'no picks saved: {e}'
  return f"saved {label}'s autotune picks for this card and step in {target}"
