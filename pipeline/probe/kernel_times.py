"""A compiled step's kernels as a trace records them: a few steps traced
with jax.profiler, the trace read back (jax.profiler.ProfileData, no
service), each kernel's time put in its instruction's class
(step_profile.py), per step.

On a GPU the trace holds each kernel's device time (XLA runs the kernels
of its command buffers one by one while a profiler is active, so the
gaps between kernels are an upper bound). A kernel run inside a command
buffer is named in the trace after the buffer, not its instruction: it is
classed by its own name, which XLA derives from its fusion's. On a CPU
there is no device: the trace holds XLA's CPU thunks as host threads ran
them, several at a time, so the figures say where the work goes, not a
device's time.
"""

import collections
import glob
import os
import re

import jax


def trace(run, log_dir):
  """Runs `run()` under jax.profiler and returns the trace's ProfileData."""
  with jax.profiler.trace(log_dir):
    run()
  path = max(glob.glob(os.path.join(log_dir, '**', '*.xplane.pb'),
                       recursive=True), key=os.path.getmtime)
  return jax.profiler.ProfileData.from_file(path)


def kernel_events(profile, module):
  """[(hlo_op, kernel name, start_ns, duration_ns)] of `module`'s
  instructions, and whether they are a device's: on the device planes
  where the trace has the module's kernels there, else on the host's
  threads (libtpu adds an empty device plane to a CPU's trace)."""

  def of_module(planes):
    events = []
    for plane in planes:
      for line in plane.lines:
        for event in line.events:
          stats = dict(event.stats)
          if stats.get('hlo_module') == module and 'hlo_op' in stats:
            events.append((stats['hlo_op'], event.name, event.start_ns,
                           event.duration_ns))
    return events

  device = of_module(p for p in profile.planes
                     if p.name.startswith('/device:'))
  if device:
    return device, True
  return of_module(p for p in profile.planes if p.name == '/host:CPU'), False


# What a GPU trace names a kernel XLA ran inside a command buffer: the
# buffer (its hlo_op), not the instruction. The kernel's own name is the
# fusion's, sanitised as XLA names kernels; a cuDNN or cuBLAS kernel there
# has its library's name.
COMMAND_BUFFER = 'command_buffer'
_LIBRARY_KERNEL = re.compile(r'(cudnn|cublas|xmma|gemm|conv|sm\d+_)',
                             re.IGNORECASE)
LIBRARY_CLASS = ('convolutions and matrix products in a command buffer '
                 '(cuDNN, cuBLAS)')


def _kernel_name(name):
  """An instruction's name as XLA names its kernel."""
  return re.sub(r'[^A-Za-z0-9_]', '_', name)


def class_of_event(hlo_op, kernel, classes, by_kernel):
  """The class of a traced kernel: its instruction's, else (inside a
  command buffer) the instruction its kernel is named after, else a
  library kernel's; None where none is found."""
  if hlo_op in classes:
    return classes[hlo_op]
  found = by_kernel.get(_kernel_name(kernel)) or by_kernel.get(
      _kernel_name(kernel).rsplit('_', 1)[0])
  if found:
    return found
  if hlo_op.startswith(COMMAND_BUFFER) and _LIBRARY_KERNEL.search(kernel):
    return LIBRARY_CLASS
  return None


def _busy_ns(intervals):
  """The union of [(start_ns, duration_ns)], in ns, and their span."""
  spans = sorted((start, start + duration) for start, duration in intervals)
  busy, end = 0, None
  for start, stop in spans:
    if end is None or start > end:
      busy += stop - start
      end = stop
    elif stop > end:
      busy += stop - end
      end = stop
  return busy, (spans[-1][1] - spans[0][0]) if spans else 0


def summarize(events, on_device, classes, steps):
  """Per-step time by class, kernel counts and idle time from the trace;
  the share inside command buffers (a GPU's), each of their kernels
  classed by its name."""
  per_class = collections.defaultdict(lambda: [0.0, 0])
  unknown, unknown_ops = 0.0, collections.Counter()
  buffered = 0.0
  by_kernel = {_kernel_name(name): cls for name, cls in classes.items()}
  for hlo_op, kernel, _, duration in events:
    if hlo_op.startswith(COMMAND_BUFFER):
      buffered += duration
    cls = class_of_event(hlo_op, kernel, classes, by_kernel)
    if cls is None:
      unknown += duration
      unknown_ops[f'{hlo_op} ({kernel})' if kernel != hlo_op
                  else hlo_op] += duration
      continue
    per_class[cls][0] += duration
    per_class[cls][1] += 1
  total = sum(ns for ns, _ in per_class.values()) + unknown
  busy, span = _busy_ns([(start, duration)
                         for _, _, start, duration in events])
  ms = lambda ns: round(ns / steps / 1e6, 3)
  return {
      'timed_on': ('the device (kernel times)' if on_device else
                   'host threads running XLA:CPU thunks (no device; threads '
                   'overlap, so shares say where the work goes)'),
      'steps_traced': steps,
      'kernel_ms_per_step': ms(total),
      'kernels_per_step': round(len(events) / steps, 1),
      'busy_ms_per_step': ms(busy),
      'idle_ms_per_step': ms(span - busy),
      'unattributed_ms_per_step': ms(unknown),
      'unattributed_share': round(unknown / total, 4) if total else 0.0,
      'command_buffers': (
          {'kernel_ms_per_step_inside': ms(buffered),
           'share': round(buffered / total, 4) if total else 0.0}
          if on_device else 'none: XLA:CPU runs no command buffers'),
      # The names the trace gave them, to find why the program lacks them.
      'unattributed_ops': {op: ms(ns)
                           for op, ns in unknown_ops.most_common(8)},
      'by_class': {
          cls: {'ms_per_step': ms(ns), 'share': round(ns / total, 4),
                'kernels_per_step': round(count / steps, 1)}
          for cls, (ns, count) in sorted(per_class.items(),
                                         key=lambda kv: -kv[1][0])}}
