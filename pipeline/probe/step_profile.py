"""Where a compiled step's time goes: a few steps traced with
jax.profiler, the trace read back (jax.profiler.ProfileData, no service),
each executed instruction's time put in a kernel class read from the
compiled HLO and the model's own layers, and the bytes the step moves.

What a class holds is decided by the instruction, not the kernel's name:
each instruction carries the op_name of the JAX operation it came from,
and Keras names a scope after every layer, so the layer it ran for (a
DepthwiseConv2D, a batch norm, squeeze-and-excite's convolutions) and
whether it ran forward or in the gradient (`transpose(`) are read there.
An instruction without an op_name takes its nearest user's.

On a GPU the trace holds each kernel's device time (XLA runs the kernels
of its command buffers one by one while a profiler is active, so the
gaps between kernels are an upper bound). A kernel run inside a command
buffer is named in the trace after the buffer, not its instruction: it is
classed by its own name, which XLA derives from its fusion's. On a CPU there is no device:
the trace holds XLA's CPU thunks as host threads ran them, several at a
time, so the figures say where the work goes, not a device's time.
"""

import collections
import glob
import os
import re

import jax
import keras
import numpy as np

from pipeline.recipe import layers

_INSTRUCTION = re.compile(
    r'^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>\(.*?\)|\S+) '
    r'(?P<op>[\w\-]+)\((?P<operands>[^)]*)\)(?P<attributes>.*)$')
_ARRAY = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]*)"')
_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2,
          'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8,
          'f64': 8}
# Instructions that run no kernel and move nothing.
_FREE = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
         'after-all', 'partition-id', 'replica-id'}
_COPIES = {'copy', 'transpose', 'copy-start', 'copy-done', 'concatenate',
           'slice', 'dynamic-slice', 'dynamic-update-slice', 'pad',
           'reshape', 'broadcast'}
_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
                'collective-permute')
CONVOLUTION_TARGETS = {'__cudnn$convForward': 'forward',
                       '__cudnn$convBiasActivationForward': 'forward',
                       '__cudnn$convBackwardInput': 'data gradient',
                       '__cudnn$convBackwardFilter': 'filter gradient'}


def _array_bytes(text):
  """Bytes of the arrays an HLO shape text holds (a tuple's elements too;
  cuDNN's u8 scratch space left out)."""
  total = 0
  for match in _ARRAY.finditer(text):
    if match['dtype'] == 'u8' and text.startswith('('):
      continue
    count = 1
    for dim in filter(None, match['dims'].split(',')):
      count *= int(dim)
    total += count * _BYTES.get(match['dtype'], 4)
  return total


def instructions(hlo_text):
  """{name: {'op', 'shape', 'operands', 'op_name', 'target', 'calls',
  'runs', 'computation', 'executed'}} of every instruction of a compiled
  module's text; 'executed': it is a kernel or call of its own (in the
  entry computation, a command buffer or a loop body), not a part of a
  fusion or a reducer."""
  found, computation = {}, None
  for line in hlo_text.splitlines():
    if line.endswith('{') and ' -> ' in line:
      computation = ('ENTRY' if line.startswith('ENTRY')
                     else line.split()[0].lstrip('%'))
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    attributes = match['attributes']
    op_name = _OP_NAME.search(attributes)
    target = _TARGET.search(attributes)
    calls = re.search(r'calls=%?([\w.\-]+)', attributes)
    found[match['name']] = {
        'op': match['op'], 'shape': match['shape'],
        'operands': re.findall(r'%([\w.\-]+)', match['operands']),
        'op_name': op_name['op_name'] if op_name else '',
        'target': target['target'] if target else '',
        'calls': calls.group(1) if calls else '',
        'runs': re.findall(r'(?:to_apply|body|condition)=%?([\w.\-]+)',
                           attributes) if match['op'] in ('call', 'while')
                else [],
        'computation': computation}
  executed, frontier = set(), {'ENTRY'}
  while frontier:  # Command buffers and loop bodies run their instructions.
    executed |= frontier
    frontier = {c for i in found.values() if i['computation'] in frontier
                for c in i['runs']} - executed
  for instruction in found.values():
    instruction['executed'] = instruction['computation'] in executed
  return found


def _fill_op_names(found):
  """An instruction without an op_name takes its nearest user's (XLA drops
  the metadata of the transposes and copies it inserts)."""
  users = collections.defaultdict(list)
  for name, instruction in found.items():
    for operand in instruction['operands']:
      users[operand].append(name)
  for name in found:
    seen, frontier = {name}, [name]
    while not found[name]['op_name'] and frontier:
      frontier = [u for n in frontier for u in users[n] if u not in seen]
      seen.update(frontier)
      named = [found[u]['op_name'] for u in frontier if found[u]['op_name']]
      if named:
        found[name]['op_name'] = named[0]


def layer_kinds(model):
  """{layer name: (kind, elements of one example's input to it)} of every
  layer in `model` and its nested models."""
  kinds = {}
  for layer in _all_layers(model):
    name = layer.name
    try:
      inputs = int(np.prod(layer.input.shape[1:]))
    except (AttributeError, ValueError, TypeError):  # Not called once.
      inputs = 0
    if '_se_' in f'_{name}':  # keras.applications' squeeze-and-excite.
      kinds[name] = ('squeeze-excite', inputs)
    elif isinstance(layer, layers.ShiftedDepthwiseConv2D):
      kinds[name] = ('depthwise taps', inputs)
    elif isinstance(layer, keras.layers.DepthwiseConv2D):
      kinds[name] = ('depthwise convolution', inputs)
    elif isinstance(layer, keras.layers.Conv2D):
      kinds[name] = ('stem and head convolution'
                     if name.startswith(('stem', 'top', 'conv1_conv'))
                     else '1x1 convolution'
                     if tuple(layer.kernel_size) == (1, 1)
                     else 'other convolution', inputs)
    elif isinstance(layer, keras.layers.BatchNormalization):
      kinds[name] = ('batch norm', inputs)
    elif isinstance(layer, keras.layers.Dense):
      kinds[name] = ('dense head', inputs)
  return kinds


def _all_layers(model):
  for layer in model.layers:
    yield layer
    if isinstance(layer, keras.Model):
      yield from _all_layers(layer)


def _computes(found, instruction, ops):
  """Whether the instruction is, or fuses, one of `ops`."""
  if instruction['op'] in ops:
    return True
  return any(i['op'] in ops for i in found.values()
             if i['computation'] == instruction['calls'])


def classify(found, kinds, batch_per_device):
  """{instruction name: kernel class} for every instruction that runs."""
  _fill_op_names(found)
  classes = {}
  for name, instruction in found.items():
    if instruction['executed'] and instruction['op'] not in _FREE:
      classes[name] = _class_of(found, name, kinds, batch_per_device)
  return classes


def _class_of(found, name, kinds, batch_per_device):
  instruction = found[name]
  op, op_name = instruction['op'], instruction['op_name']
  if op in ('call', 'while'):
    return 'calls and loops (what they run is counted apart where traced)'
  scopes = re.findall(r'[\w\-.]+', op_name)
  if 'moving_average' in scopes:
    return 'moving-average update'
  if 'optimizer' in scopes:
    return 'optimizer update'
  if op.startswith(_COLLECTIVES):
    return 'collectives'
  layer = next((s for s in reversed(scopes) if s in kinds), None)
  kind, input_size = kinds.get(layer, (None, 0))
  convolution = (instruction['target'] in CONVOLUTION_TARGETS or
                 _computes(found, instruction, ('convolution', 'dot')))
  if kind == 'squeeze-excite':
    return kind
  if kind and kind.endswith('convolution') and convolution:
    return f'{kind}: ' + _direction(instruction, op_name,
                                    batch_per_device * input_size)
  if kind == 'depthwise taps':  # Slices and products: no convolution.
    return 'depthwise convolution: ' + (
        'forward' if 'transpose(' not in op_name else 'filter gradient'
        if _computes(found, instruction, ('reduce',)) else 'data gradient')
  if kind == 'batch norm':
    return ('batch-norm statistics'
            if _computes(found, instruction, ('reduce', 'reduce-window'))
            else 'batch norm, elementwise')
  if kind == 'dense head':
    return kind
  words = set(re.findall(r'[a-z]+', name)) - {'fusion', 'loop', 'wrapped'}
  if op in _COPIES or (op == 'fusion' and words and words <= _COPIES | {
      'bitcast'}):
    return 'copies and transposes'
  if convolution:
    return 'convolutions and matrix products (other)'
  if _computes(found, instruction, ('reduce', 'reduce-window')):
    return 'reductions (other)'
  if op == 'fusion':
    return 'elementwise fusions'
  return 'other'


def _direction(instruction, op_name, input_elements):
  """forward, data gradient or filter gradient of a convolution (or of the
  matrix product XLA made of a 1x1 one), whose layer's input on one
  device has `input_elements`."""
  if instruction['target'] in CONVOLUTION_TARGETS:
    return CONVOLUTION_TARGETS[instruction['target']]
  if 'transpose(' not in op_name:
    return 'forward'
  # The data gradient is the layer's input's gradient: its size.
  dims = [int(d) for d in _ARRAY.search(instruction['shape'])['dims']
          .split(',') if d]
  return ('data gradient' if int(np.prod(dims)) == input_elements
          else 'filter gradient')


def bytes_moved(found, classes):
  """Bytes of the operands and results of every instruction that runs, each
  counted once: what the step reads and writes at least once."""
  return sum(
      _array_bytes(found[name]['shape']) +
      sum(_array_bytes(found[o]['shape']) for o in found[name]['operands']
          if o in found)
      for name in classes if found[name]['op'] not in ('call', 'while'))


def module_name(hlo_text):
  """The HloModule's name, as trace events name it."""
  return re.match(r'HloModule ([\w.\-]+)', hlo_text).group(1)


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
