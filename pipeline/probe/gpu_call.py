"""One prepared call for a lent GPU (launch.gpu_call): the same kernels in
every process, the depthwise forms, and Keras' own model beside them.

Each step is a fresh `launch.probe` process (XLA reads its flags once a
process, and its autotuner picks per process), in this order:

  flags        XLA's autotune flags, each passed to this jaxlib on a tiny
               convolution: written, then loaded with require-complete
  kernels      depthwise=pallas's kernels against XLA's convolution on B0's
               shapes: their differences, and each one's time
  A            stage (a), autotuning anew; its picks saved (--save_autotune)
  B            loading A's picks, a miss failing the compile: (a), fed
               from the host (h), and its profile (g)
  with_pallas  depthwise=pallas: (a), (h) and its profile (g)
  keras        (a) loading the picks (Keras' own convolutions are not among
               them: no require-complete), then Keras' own B0 with
               model.fit (f), whose epochs alternate with (a)'s step timed
               again, so a card's drift favours neither
  C            (a) loading the picks again, require-complete
  with_stacked_grad  depthwise=stacked_grad (the one-reduction filter
               gradient)

A step that would not end within what is left of the budget is skipped.
OUT/call.json holds every step's figures and the summary, rewritten after
each step; each step's folder its probe.json, picks, convolutions and
(for A and B) the compiled step's text. The saved picks go to OUT/cache
(XDG_CACHE_HOME), so a call leaves the machine's own cache alone.
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from pipeline.rules.speed import autotune

# Seconds kept back so the call ends within its budget, and the least a
# step is started with (a process's start and one compile).
_MARGIN_S = 10
_LEAST_S = 45

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
class Step:
  name: str
  what: str
  flags: tuple


STEPS = (
    Step('A', 'autotunes anew and saves its picks; depthwise=pallas_forward '
         'in the same process', ('--stages=a', '--save_autotune', '--keep_hlo',
                                 '--variant=depthwise=pallas_forward')),
    Step('B', "loads A's picks, require-complete",
         ('--stages=ahg', '--autotune=require', '--keep_hlo')),
    Step('with_pallas', 'depthwise=pallas',
         ('--stages=ahg', '--config.depthwise=pallas')),
    Step('keras', "loads the picks; Keras' own model.fit",
         ('--stages=af', '--autotune=load')),
    Step('C', 'loads the picks, require-complete',
         ('--stages=a', '--autotune=require')),
    Step('with_stacked_grad', 'depthwise=stacked_grad',
         ('--stages=ah', '--config.depthwise=stacked_grad')),
)
# The loading processes, whose spread shows the same kernels in each.
LOADING = ('B', 'keras', 'C')


def environment(out):
  """The steps' environment: picks saved under OUT/cache, no compile
  cache (each process compiles: what is measured)."""
  env = dict(os.environ, XDG_CACHE_HOME=os.path.join(out, 'cache'),
             PYTHONUNBUFFERED='1')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


def check_flags(out, env):
  """Each of autotune.FLAGS given to this jaxlib (which aborts on a flag it
  does not know) on a tiny convolution: written, then loaded with
  require-complete."""
  results = os.path.join(out, 'flags', 'picks.textproto')
  os.makedirs(os.path.dirname(results), exist_ok=True)
  figures = {}
  for name, xla_flags in (
      ('dump', [f'{autotune.DUMP_FLAG}={results}']),
      ('load_require_complete', autotune.flags(results, True))):
    done = subprocess.run(
        [sys.executable, '-c', _TINY_CONVOLUTION], capture_output=True,
        text=True, check=False, timeout=300,
        env=dict(env, XLA_FLAGS=autotune.with_flags(env.get('XLA_FLAGS'),
                                                    xla_flags)))
    figures[name] = {'exit': done.returncode,
                     'tail': (done.stderr or done.stdout).strip()[-300:]
                     if done.returncode else ''}
  figures['results_written'] = os.path.exists(results)
  figures['accepted'] = all(figures[n]['exit'] == 0 for n in
                            ('dump', 'load_require_complete'))
  return figures


def check_kernels(out, env, timeout_s=120, sections=('rows', 'tiles')):
  """depthwise_check's `sections` (pallas against XLA, shape by shape; the
  gradients' tiles)."""
  path = os.path.join(out, f'kernels-{"-".join(sections)}.json')
  try:
    done = subprocess.run(
        [sys.executable, '-m', 'pipeline.probe.depthwise_check', path,
         *sections],
        capture_output=True, text=True, check=False, timeout=timeout_s,
        env=env)
    failed = done.returncode and (done.stderr or done.stdout).strip()[-400:]
  except subprocess.TimeoutExpired:
    failed = f'outlasted {timeout_s} s'
  try:
    with open(path, encoding='utf-8') as f:
      figures = json.load(f)
  except (OSError, ValueError):
    figures = {}
  if failed:
    figures['failed'] = failed
  return figures


def run_step(step, probe_flags, out, env, timeout_s):
  """One step's process; its probe.json's stages, or why there are none."""
  folder = os.path.join(out, step.name)
  began = time.perf_counter()
  try:
    done = subprocess.run(
        [sys.executable, '-m', 'launch.probe', *probe_flags, *step.flags,
         f'--out={folder}', f'--budget_s={int(timeout_s)}'],
        capture_output=True, text=True, check=False, timeout=timeout_s + 15,
        env=env)
    output = done.stdout + done.stderr
  except subprocess.TimeoutExpired:
    return {'failed': f'outlasted {timeout_s:.0f} s',
            'seconds': round(time.perf_counter() - began, 1)}
  with open(os.path.join(out, f'{step.name}.log'), 'w', encoding='utf-8') as f:
    f.write(output)
  try:
    with open(os.path.join(folder, 'probe.json'), encoding='utf-8') as f:
      written = json.load(f)
    figures = {'stages': written['stages'],
               'variants': written.get('variants', {})}
  except (OSError, ValueError, KeyError):
    figures = {'failed': f'exit {done.returncode}: ' + ' '.join(
        output.strip().splitlines()[-2:])[-400:]}
  figures['seconds'] = round(time.perf_counter() - began, 1)
  figures['noisy_timing_lines'] = output.count(autotune.NOISY_TIMING)
  figures['saved'] = [line for line in output.splitlines()
                      if 'autotune picks' in line]
  return figures


# Steps that are no probe process: the flags, the kernels shape by shape
# (and their gradients' tiles alone).
CHECKS = ('flags', 'kernels', 'tiles')
ORDER = ('flags', 'kernels', *(step.name for step in STEPS))
# Every step a call may name.
NAMES = (*ORDER, 'tiles')


def run(out, budget_s, probe_flags, order=ORDER, report=print):
  """The call: the steps named in `order`, each skipped where it would not
  end in what is left of `budget_s`; the figures (OUT/call.json)."""
  began = time.perf_counter()
  env = environment(out)
  figures = {'probe_flags': list(probe_flags), 'steps': {}}
  steps = {step.name: step for step in STEPS}

  def save():
    figures['elapsed_s'] = round(time.perf_counter() - began, 1)
    figures['summary'] = summarize(figures['steps'])
    with open(os.path.join(out, 'call.json.partial'), 'w',
              encoding='utf-8') as f:
      json.dump(figures, f, indent=2)
    os.replace(os.path.join(out, 'call.json.partial'),
               os.path.join(out, 'call.json'))

  for name in order:
    left_s = budget_s - (time.perf_counter() - began) - _MARGIN_S
    if left_s < _LEAST_S:
      result = {'skipped': f'{left_s:.0f} s of the budget left'}
    elif name == 'flags':
      result = check_flags(out, env)
    elif name in CHECKS:
      result = check_kernels(out, env, left_s, (
          ('rows', 'tiles') if name == 'kernels' else ('tiles',)))
    else:
      result = dict(run_step(steps[name], probe_flags, out, env, left_s),
                    what=steps[name].what)
    (figures if name in CHECKS else figures['steps'])[name] = result
    report(f'gpu_call: {name}: '
           f'{json.dumps(result)[:2000] if name in CHECKS else _brief(result)}')
    save()
  for line in summary_lines(figures['summary']):
    report(f'gpu_call: {line}')
  return figures


def _brief(result):
  """A step's figures in one line: each stage's rate and compile time."""
  if 'stages' not in result:
    return json.dumps(result)[:400]
  rows = []
  for name, stage in result['stages'].items():
    shown = {k: stage[k] for k in ('images_per_sec', 'compile_s',
                                   'convolutions', 'kernel_picks', 'failed',
                                   'skipped') if k in stage}
    rows.append(f'{name} {json.dumps(shown)}')
  for name, variant in result.get('variants', {}).items():
    shown = {k: variant[k] for k in ('images_per_sec', 'of_baseline',
                                     'compile_s', 'failed') if k in variant}
    rows.append(f'variant {name} {json.dumps(shown)}')
  return (f"{'; '.join(rows)}; {result['seconds']} s, "
          f"{result['noisy_timing_lines']} noisy timing lines")


def _stage(steps, name, stage, key='images_per_sec'):
  return steps.get(name, {}).get('stages', {}).get(stage, {}).get(key)


def summarize(steps):
  """What the call shows: the loaded picks against A's, the spread of
  the processes that load them, each form against the baseline, and the
  step against Keras' own model.fit."""
  rate = lambda name: _stage(steps, name, 'a_device_rate')
  loading = {n: rate(n) for n in LOADING if rate(n)}
  summary = {}
  if rate('A') and loading:
    summary['of_A'] = {n: round(r / rate('A'), 4) for n, r in loading.items()}
    summary['compile_s'] = {n: _stage(steps, n, 'a_device_rate',
                                      'compile_s') for n in ('A', *loading)}
    summary['same_algorithms_as_A'] = {
        n: _stage(steps, n, 'a_device_rate',
                  'convolution_algorithms_sha256') ==
        _stage(steps, 'A', 'a_device_rate', 'convolution_algorithms_sha256')
        for n in loading}
    summary['kernel_picks'] = {
        n: _stage(steps, n, 'a_device_rate', 'kernel_picks')
        for n in loading}
  if len(loading) > 1:
    values = list(loading.values())
    summary['loading_spread'] = round(
        (max(values) - min(values)) / statistics.median(values), 4)
  baseline = statistics.median(loading.values()) if loading else rate('A')
  for step in ('with_pallas', 'with_stacked_grad'):
    if rate(step) and baseline:
      summary[f'{step}_of_baseline'] = round(rate(step) / baseline, 4)
  for name, variant in steps.get('A', {}).get('variants', {}).items():
    # Timed in A's process beside A's step timed again just before.
    summary[f'{name} (in A)'] = variant.get('of_baseline',
                                            variant.get('failed'))
  keras = _stage(steps, 'keras', 'f_keras_fit')
  fed = {n: _stage(steps, n, 'h_host_fed') for n in
         ('B', 'with_pallas', 'with_stacked_grad')}
  fed = {n: r for n, r in fed.items() if r}
  if keras and fed:
    best = max(fed, key=fed.get)
    summary['host_fed_of_keras_fit'] = {
        'ours': best, 'images_per_sec': fed[best],
        'keras_images_per_sec': keras, 'ratio': round(fed[best] / keras, 4),
        'baseline_alternating_in_its_process': steps['keras']['stages'][
            'f_keras_fit'].get('this_projects_step_against_it')}
  summary['depthwise_ms_per_step'] = {
      n: _depthwise_classes(steps, n) for n in ('B', 'with_pallas')}
  return summary


def _depthwise_classes(steps, name):
  profile = steps.get(name, {}).get('stages', {}).get('g_profile', {})
  return {k: v.get('ms_per_step') for k, v in profile.get('by_class', {})
          .items() if k.startswith('depthwise')}


def summary_lines(summary):
  """The summary as the call's last lines."""
  return [f'{key}: {json.dumps(value)}' for key, value in summary.items()]
