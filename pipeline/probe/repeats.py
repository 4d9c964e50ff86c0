"""Stage (a) in fresh processes (`launch.probe --repeats=N`).

XLA's autotuner picks each convolution's algorithm by timing candidates in
the process that compiles it, and keeps the pick for every later compile
there (a persistent compile cache keeps it longer). On one H200 one
process in six drew depthwise convolutions 3.8x slower than the others
drew: the whole step 30% slower, with nothing said. One process's rate is
therefore one draw; N fresh processes, each compiling and autotuning anew,
give the spread, and where one lies more than OUTLIER off the median, the
kernel classes whose time differs from the median process's (each process
profiles its step where stage (g) is asked for) and how many of the
autotuner's picks differ (each process writes them, AUTOTUNE_FILE).
"""

import os
import statistics

from pipeline.probe import picks as picks_lib
from pipeline.probe import variants as probe_variants
from pipeline.rules.speed import autotune

# A process this far from the median rate is an outlier worth explaining.
OUTLIER = 0.05
# A kernel class whose time differs by less than this (and 5%) is noise.
CLASS_NOISE_MS = 0.05
def in_fresh_processes(count, command, budget_s, out_dir, with_profile):
  """Stage (a) (and (g) where `with_profile`) in `count` fresh processes of
  launch.probe (`command`: its flags), one after another, before this one
  takes the devices; [(label, figures, folder)]."""
  measured = []
  for index in range(count):
    folder = os.path.join(out_dir, f'repeat-{index + 1}')
    label = f'fresh process {index + 1}'
    measured.append((label, probe_variants.in_own_process(
        probe_variants.Variant(label), command, budget_s / count, folder,
        with_profile), folder))
  return measured


def summarize(processes):
  """The spread of [(label, stage (a)'s figures with their 'profile'
  where traced, the folder of its autotune file)]: each rate against the
  median, and for an outlier what differs from the median process."""
  timed = [(label, figures, folder) for label, figures, folder in processes
           if 'images_per_sec' in figures]
  if not timed:
    return {'failed': 'no process timed stage (a)',
            'processes': {label: figures for label, figures, _ in processes}}
  rates = [figures['images_per_sec'] for _, figures, _ in timed]
  median = statistics.median(rates)
  # The process nearest the median stands for it.
  _, typical, typical_folder = min(
      timed, key=lambda row: abs(row[1]['images_per_sec'] - median))
  rows = {}
  for label, figures, folder in processes:
    if 'images_per_sec' not in figures:
      rows[label] = {key: figures[key] for key in ('failed', 'skipped')
                     if key in figures}
      continue
    row = {'images_per_sec': figures['images_per_sec'],
           'compile_s': figures.get('compile_s'),
           'of_median': round(figures['images_per_sec'] / median, 3)}
    if abs(row['of_median'] - 1) > OUTLIER:
      row['kernel_classes_that_differ'] = classes_that_differ(
          figures.get('profile'), typical.get('profile'))
      row['autotune_picks_that_differ'] = picks_that_differ(
          os.path.join(folder, picks_lib.AUTOTUNE_FILE),
          os.path.join(typical_folder, picks_lib.AUTOTUNE_FILE))
    rows[label] = row
  return {'processes': rows, 'median_images_per_sec': median,
          'spread': round((max(rates) - min(rates)) / median, 3),
          'outliers': sum(abs(row.get('of_median', 1) - 1) > OUTLIER
                          for row in rows.values())}


def classes_that_differ(profile, typical):
  """{kernel class: {ms_per_step, median_process_ms_per_step}} where the
  outlier's time differs from the median process's by more than 5% and
  CLASS_NOISE_MS, the largest difference first; without both profiles, a
  line (str) saying which stage gives them."""
  if not (profile and typical and 'by_class' in profile and
          'by_class' in typical):
    return 'no profile to compare: ask for stage g'
  ours, theirs = profile['by_class'], typical['by_class']
  differ = {}
  for name in set(ours) | set(theirs):
    mine = ours.get(name, {}).get('ms_per_step', 0.0)
    median = theirs.get(name, {}).get('ms_per_step', 0.0)
    if abs(mine - median) > max(CLASS_NOISE_MS, 0.05 * median):
      differ[name] = {'ms_per_step': mine,
                      'median_process_ms_per_step': median}
  return dict(sorted(differ.items(), key=lambda kv: -abs(
      kv[1]['ms_per_step'] - kv[1]['median_process_ms_per_step'])))


def picks_that_differ(path, typical_path):
  """How many of the autotuner's picks (the results in its file, keyed by
  the program they were made for) differ between two processes' files;
  a line where there are none (no GPU autotuned: a CPU)."""
  ours, theirs = _picks(path), _picks(typical_path)
  if not (ours and theirs):
    return 'no autotuner results written (only a GPU writes them)'
  shared = set(ours) & set(theirs)
  return {'differ': sum(ours[key] != theirs[key] for key in shared),
          'compared': len(shared)}


def _picks(path):
  """{the lines that key a result: the result} of an autotune results
  file (autotune.blocks)."""
  try:
    with open(path, encoding='utf-8') as f:
      return autotune.blocks(f.read())[1]
  except OSError:
    return {}
