"""Where a compiled step's time goes, read from its compiled HLO and the
model's own layers: each executed instruction's kernel class, and the
bytes the step moves. kernel_times.py puts a trace's kernels in them.

What a class holds is decided by the instruction, not the kernel's name:
each instruction carries the op_name of the JAX operation it came from,
and Keras names a scope after every layer, so the layer it ran for (a
DepthwiseConv2D, a batch norm, squeeze-and-excite's convolutions) and
whether it ran forward or in the gradient (`transpose(`) are read there.
An instruction without an op_name takes its nearest user's.
"""

import collections
import re

import keras
import numpy as np


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
