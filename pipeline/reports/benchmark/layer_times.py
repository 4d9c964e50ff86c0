"""Where a training step's time goes, by kind of layer: a profiler trace of
a few executions on a synthetic batch, each operation's own time summed by
the layer its name scope names (keras.applications' names: `_dwconv`,
`_se_`, `_bn`, ...) or its type (casts), per step. launch.benchmark
--layer_times puts one column per policy, so what 16 bits cost or save in
each kind of layer is one table (TensorFlow's operations; XLA's fused
programs on JAX have no such names).
"""

import collections
import glob
import json
import os
import tempfile

# (kind, the op names' substrings that make it), first match wins; an
# operation of type Cast is a cast wherever it stands.
KINDS = (
    ('depthwise conv', ('_dwconv',)),
    ('squeeze-excite', ('_se_',)),
    ('batch norm', ('_bn/', '_bn_', 'stem_bn', 'top_bn')),
    ('1x1 conv', ('_expand_conv', '_project_conv', 'top_conv')),
    ('stem conv', ('stem_conv',)),
    ('activations', ('_activation', 'stem_activation', 'top_activation')),
    ('head', ('logits', 'head_dropout')),
    ('optimizer', ('adam', 'sgd', 'rmsprop', 'AssignSubVariableOp')),
)
CASTS, OTHER = 'casts', 'other'
ORDER = (*[kind for kind, _ in KINDS], CASTS, OTHER)


def kind_of(op_type, name):
  """The kind of layer an operation of `op_type` named `name` belongs to."""
  if op_type == 'Cast':
    return CASTS
  for kind, marks in KINDS:
    if any(mark in name or mark == op_type for mark in marks):
      return kind
  return OTHER


def measure(trainer, iterator, steps_per_execution, executions, profiler):
  """{kind: milliseconds a step} over `executions` of the `trainer`'s step
  on `iterator` (after one untraced execution, so compiling is not in
  it), traced by `profiler` (Backend.profiler's start and stop)."""
  start_trace, stop_trace = profiler
  trainer.train(iterator, steps_per_execution)  # Compiled and warm.
  with tempfile.TemporaryDirectory() as logdir:
    start_trace(logdir)
    try:
      for _ in range(executions):
        trainer.train(iterator, steps_per_execution)
    finally:
      stop_trace()
    totals = _self_times(logdir)
  steps = executions * steps_per_execution
  return {kind: round(totals.get(kind, 0.0) / 1e3 / steps, 3)
          for kind in ORDER}


def _self_times(logdir):
  """{kind: microseconds} of every host operation's own time in the trace
  under `logdir` (xprof's framework_op_stats), idle time left out."""
  from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*',
                                 '*.xplane.pb'))
  data, _ = raw_to_tool_data.xspace_to_tool_data(paths, 'framework_op_stats',
                                                 {})
  table = json.loads(data)[0]
  columns = [column['id'] for column in table['cols']]
  totals = collections.Counter()
  for row in table['rows']:
    op = dict(zip(columns, (cell.get('v') for cell in row['c'])))
    if op['type'] != 'IDLE':
      totals[kind_of(op['type'], op['operation'])] += op['total_self_time']
  return totals


def table(rows):
  """The sweep's rows that have layer times as a text table: a column a
  policy (ms a step), the last two columns' ratio where there are two."""
  measured = [row for row in rows if row.get('layer_ms_per_step')]
  if not measured:
    return ''
  names = [f'{row["policy"]}' for row in measured]
  lines = ['ms a step by kind of layer (profiled; ratio: last / first)',
           f'{"kind":<16}' + ''.join(f'{name:>16}' for name in names)
           + ('  ratio' if len(measured) > 1 else '')]
  for kind in ORDER + ('total',):
    values = [row['layer_ms_per_step'].get(kind) if kind != 'total' else
              sum(row['layer_ms_per_step'].values()) for row in measured]
    ratio = (f'  {values[-1] / values[0]:.2f}' if len(values) > 1 and
             values[0] else '')
    lines.append(f'{kind:<16}' + ''.join(f'{v:>16.2f}' for v in values)
                 + ratio)
  return '\n'.join(lines)
