"""What a launch.gpu_call's records show, in a line a part and a summary:
the main command's rate beside the probe's, the same kernels in every
process, the experiments, Keras' own model.fit.
"""

import json
import statistics

# The processes that load A's picks, whose spread shows the same kernels
# in each.
LOADING = ('B', 'C', 'keras')




def brief(record):
  """A part's record in one line: how it ended, each stage's rate and
  compile time."""
  if 'skipped' in record:
    return f"skipped: {record['skipped']}"
  ended = (f"stopped by its {record['stopped']}" if record.get('stopped')
           else f"exit {record.get('exit')}")
  rows = []
  for name, stage in record.get('stages', {}).items():
    if isinstance(stage, dict):
      shown = {k: stage[k] for k in ('images_per_sec', 'compile_s',
                                     'kernel_picks', 'failed', 'skipped')
               if k in stage}
      rows.append(f'{name} {json.dumps(shown)}')
  for name, variant in record.get('variants', {}).items():
    shown = {k: variant[k] for k in ('images_per_sec', 'of_baseline',
                                     'compile_s', 'failed') if k in variant}
    rows.append(f'variant {name} {json.dumps(shown)}')
  for run in ('first', 'resumed'):
    if run in record:
      shown = {k: v for k, v in record[run].items() if k != 'last_lines'}
      rows.append(f'{run} {json.dumps(shown)}')
  if 'accepted' in record:
    rows.append(f"accepted {record['accepted']}")
  tail = '' if not record.get('exit') else (
      f"; last line: {(record.get('last_lines') or [''])[-1][:200]}")
  return (f"{ended} in {record.get('seconds')} s"
          f"{': ' + '; '.join(rows) if rows else ''}{tail}")


def _stage(parts, name, stage, key='images_per_sec'):
  return parts.get(name, {}).get('stages', {}).get(stage, {}).get(key)


def summarize(parts):
  """What the call shows: the main command's rate beside the probe's, the
  loaded picks against A's, the spread of the processes that load them,
  each experiment against the baseline, and the step against Keras' own
  model.fit."""
  rate = lambda name: _stage(parts, name, 'a_device_rate')
  summary = {}
  train = parts.get('train', {})
  if train.get('resumed', {}).get('images_per_sec'):
    summary['train'] = {
        'images_per_sec': train['resumed']['images_per_sec'],
        'compile_s': {run: train[run].get('compile_s') for run in
                      ('first', 'resumed')},
        'resumed_at_step': train['resumed'].get('resumed_at_step')}
    if rate('A'):
      summary['train']['of_A'] = round(
          train['resumed']['images_per_sec'] / rate('A'), 4)
  loading = {n: rate(n) for n in LOADING if rate(n)}
  if rate('A') and loading:
    summary['of_A'] = {n: round(r / rate('A'), 4) for n, r in loading.items()}
    summary['compile_s'] = {n: _stage(parts, n, 'a_device_rate',
                                      'compile_s') for n in ('A', *loading)}
    summary['same_algorithms_as_A'] = {
        n: _stage(parts, n, 'a_device_rate',
                  'convolution_algorithms_sha256') ==
        _stage(parts, 'A', 'a_device_rate', 'convolution_algorithms_sha256')
        for n in loading}
  if len(loading) > 1:
    values = list(loading.values())
    summary['loading_spread'] = round(
        (max(values) - min(values)) / statistics.median(values), 4)
  keras = _stage(parts, 'keras', 'f_keras_fit')
  fed = _stage(parts, 'B', 'h_host_fed')
  if keras and fed:
    summary['host_fed_of_keras_fit'] = {
        'images_per_sec': fed, 'keras_images_per_sec': keras,
        'ratio': round(fed / keras, 4),
        'baseline_alternating_in_its_process': parts['keras']['stages'][
            'f_keras_fit'].get('this_projects_step_against_it')}
  profile = parts.get('B', {}).get('stages', {}).get('g_profile', {})
  depthwise = {k: v.get('ms_per_step') for k, v in profile.get(
      'by_class', {}).items() if k.startswith('depthwise')}
  if depthwise:
    summary['depthwise_ms_per_step'] = depthwise
  return summary


def summary_lines(summary):
  """The summary as the call's last lines."""
  return [f'{key}: {json.dumps(value)}' for key, value in summary.items()]
