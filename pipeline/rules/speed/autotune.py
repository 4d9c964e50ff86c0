"""XLA's autotuner picks, saved once and loaded by every later process, so
every process on a card runs the same kernels.

XLA times candidate algorithms for each convolution in the process that
compiles it and keeps the fastest it saw; on a busy or noisy GPU that is a
draw ("Delay kernel timed out: measured time has sub-optimal accuracy" in
its log). On one H200 one process in four drew a depthwise kernel 3.8x
slower, and a compile cache then served that draw to every later run.
XLA's determinism notes give the fix: autotune once, write the results
(`--xla_gpu_dump_autotune_results_to`), and load them in every later
compile (`--xla_gpu_load_autotune_results_from`;
`--xla_gpu_require_complete_aot_autotune_results` fails a compile that
misses one instead of timing it anew).

`launch.probe --save_autotune` keeps the results of its fastest process
(within FASTEST of the median of --repeats), a file per step, in a folder
per card (nvidia-smi's name; each result names XLA's own description of
the device), framework and cuDNN version. Before JAX or TensorFlow load,
a run merges that folder's files into one, named by its hash, and passes
it to XLA; the compile cache's folder names the hash too, so a program
compiled under other picks is never served. A file written under other
software is never passed: XLA rejects another version's file and fails
the run.

After compiling, `differing_picks` reads the convolutions' algorithms out
of the compiled program's text and sets them against the saved results.
Imports no TensorFlow, JAX or Keras.
"""

import collections
import hashlib
import os
import re

from pipeline.storage import user_cache

DUMP_FLAG = '--xla_gpu_dump_autotune_results_to'
LOAD_FLAG = '--xla_gpu_load_autotune_results_from'
REQUIRE_COMPLETE_FLAG = '--xla_gpu_require_complete_aot_autotune_results'
# Every flag this module gives XLA, which aborts on one it does not know
# (tests pass each to the pinned jaxlib).
FLAGS = (DUMP_FLAG, LOAD_FLAG, REQUIRE_COMPLETE_FLAG)
# The noisy timing the autotuner warns of, a line per candidate it could
# not time well.
NOISY_TIMING = 'Delay kernel timed out'
# A process whose rate is this close to the median of a probe's repeats
# may have its picks kept (the fastest such one).
FASTEST = 0.02
_SUFFIX = '.textproto'
_MERGED = 'merged'


def folder(card, software):
  """Where the picks for this card and software (e.g. 'jax-0.11.2-cudnn-
  9.19.0.56') are kept: a file per step."""
  return user_cache.folder('autotune', user_cache.slug(card),
                           user_cache.slug(software))


def blocks(text):
  """(header lines, {key: block}) of a results file (text protobuf): its
  top-level scalar fields, and each top-level message (XLA 0.11's
  `entries { key { .. } value { .. } }`, older `results { device ..
  hlo .. result { .. } }`) by the lines before its value."""
  header, found, lines = [], {}, None
  for line in text.splitlines():
    if lines is None and re.match(r'^\w+ \{$', line):
      lines = [line]
    elif lines is not None:
      lines.append(line)
      if line == '}':
        key_lines = []
        for inner in lines:
          if re.match(r'^  (value|result) \{', inner):
            break
          key_lines.append(inner)
        found['\n'.join(key_lines)] = '\n'.join(lines)
        lines = None
    elif line.strip():
      header.append(line)
  return header, found


def _kind(found):
  """The name of a file's top-level messages ('entries', 'results')."""
  return next(iter(found), '').split(' ', 1)[0]


def _sidecar(path):
  return path[:-len(_SUFFIX)] + '.json'


def save(source, card, software, step, convolutions):
  """Keeps the results file `source` as the picks of `step` on this card
  and software (whole or not at all), with the software it was written
  under and `convolutions` (compiled_convolutions of the step that wrote
  it: what a later program's are compared with); returns its path."""
  with open(source, encoding='utf-8') as f:
    text = f.read()
  if not blocks(text)[1]:
    raise ValueError(f'{source} holds no autotune results')
  target = os.path.join(folder(card, software),
                        user_cache.slug(step) + _SUFFIX)
  user_cache.write_json(_sidecar(target), {
      'software': software, 'card': card, 'step': step,
      'convolutions': convolutions})
  os.makedirs(os.path.dirname(target), exist_ok=True)
  with open(target + '.tmp', 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(target + '.tmp', target)
  return target


def merged(card, software):
  """(the path of every saved step's results for this card and software
  in one file, named by its hash, or None where none is saved; a line for
  each file passed over). A file written under other software, or in
  another format than the newest file's, is passed over: XLA would
  refuse the whole file, and fail the run."""
  where = folder(card, software)
  try:
    paths = sorted((os.path.join(where, n) for n in os.listdir(where)
                    if n.endswith(_SUFFIX)), key=os.path.getmtime)
  except OSError:
    return None, []
  loaded, skipped = [], []
  for path in paths:
    try:
      with open(path, encoding='utf-8') as f:
        header, found = blocks(f.read())
      record = user_cache.read_json(_sidecar(path)) or {}
    except (OSError, ValueError) as e:
      skipped.append(f'autotune picks {path} unreadable ({e}): passed over')
      continue
    if record.get('software') != software:
      skipped.append(f'autotune picks {path} were written under '
                     f"{record.get('software')}, not {software}: passed "
                     'over (launch.probe --save_autotune writes them again)')
      continue
    loaded.append((header, found, record.get('convolutions', {})))
  newest = _kind(loaded[-1][1]) if loaded else None
  entries, convolutions, header = {}, {}, []
  for file_header, found, file_convolutions in loaded:
    if _kind(found) != newest:
      skipped.append(f'autotune picks of the older {_kind(found)!r} format '
                     'passed over')
      continue
    header = file_header
    entries.update(found)
    convolutions.update(file_convolutions)
  if not entries:
    return None, skipped
  body = ''.join(f'{line}\n' for line in header) + ''.join(
      f'{block}\n' for _, block in sorted(entries.items()))
  digest = hashlib.sha256(body.encode()).hexdigest()[:16]
  target = os.path.join(where, _MERGED, f'{digest}{_SUFFIX}')
  if not os.path.exists(target):
    user_cache.write_json(_sidecar(target), {
        'software': software, 'card': card, 'convolutions': convolutions})
    with open(target + '.tmp', 'w', encoding='utf-8') as f:
      f.write(body)
    os.replace(target + '.tmp', target)
  return target, skipped


def saved_convolutions(path):
  """{convolution key: [algorithm, ...]} the steps whose picks `path`
  holds compiled with."""
  record = user_cache.read_json(_sidecar(path)) or {}
  return record.get('convolutions', {})


def digest_of(path):
  """The hash a merged file is named by."""
  return os.path.basename(path)[:-len(_SUFFIX)]


def prepare(card, software, environ, mode='load', write_to=None):
  """Has XLA load the picks saved for `card` (the driver's name for this
  process's first GPU; None off a GPU) and `software`, in `environ`'s
  XLA_FLAGS before TensorFlow or JAX start XLA. `mode` 'load'; 'require':
  every convolution's, a miss fails the compile (ValueError where none is
  saved); 'fresh': none. With `write_to`, this process writes its own
  picks there. A user's own XLA_FLAGS naming a file stand. Returns (the
  file loaded or None, a line for each saved file passed over)."""
  added = [f'{DUMP_FLAG}={os.path.abspath(write_to)}'] if write_to else []
  path, passed_over = None, []
  if (card and mode != 'fresh' and
      LOAD_FLAG not in environ.get('XLA_FLAGS', '')):
    path, passed_over = merged(card, software)
    if path:
      added += flags(path, require_complete=mode == 'require')
      keep(path)
    elif mode == 'require':
      raise ValueError(f'no picks saved for {card} and {software}: save '
                       'them first with --save_autotune')
  if added:
    environ['XLA_FLAGS'] = with_flags(environ.get('XLA_FLAGS'), added)
  return path, passed_over


def flags(path, require_complete=False):
  """XLA's flags that load the results at `path`."""
  return [f'{LOAD_FLAG}={path}'] + (
      [REQUIRE_COMPLETE_FLAG] if require_complete else [])


def with_flags(xla_flags, added):
  """XLA_FLAGS' value `xla_flags` with `added` (flags replace their
  namesakes: XLA would read the first)."""
  names = {flag.split('=', 1)[0] for flag in added}
  kept = [flag for flag in (xla_flags or '').split()
          if flag.split('=', 1)[0] not in names]
  return ' '.join(kept + list(added))


# A convolution custom call of a compiled program, and of a results entry.
_CONVOLUTION = re.compile(r'custom_call_target=\\?"(__cudnn\$conv\w+)\\?"')
_ARRAY = re.compile(r'[a-z]+\d*\[[\d,]*\]')


def _instruction_key(text):
  """What identifies a convolution whatever the names and layouts: its
  target, array shapes (result, then operands; not the scratch space,
  whose size the pick sets), window, dimension labels and groups."""
  target = _CONVOLUTION.search(text)
  head = text.split('custom_call_target')[0]
  parts = [target.group(1) if target else '',
           ' '.join(a for a in _ARRAY.findall(head) if not a.startswith('u8['))]
  for attribute in ('window', 'dim_labels', 'feature_group_count'):
    match = re.search(rf'{attribute}=(\{{[^}}]*\}}|[\w>\-]+)', head)
    parts.append(match.group(1) if match else '')
  return ' | '.join(parts)


def _algorithm(text):
  """A compiled convolution's algorithm as one comparable line (its
  backend config's id, math type and tuning knobs), or None."""
  algorithm = re.search(r'"algorithm":\{(.*?)\}\s*,\s*"conv_result_scale"',
                        text) or re.search(r'"algorithm":(\{.*?\}\})', text)
  if not algorithm:
    return None
  fields = dict(re.findall(r'"(algo_id|math_type)":"?(\w+)"?',
                           algorithm.group(1)))
  knobs = re.search(r'"tuning_knobs":\{([^}]*)\}', algorithm.group(1))
  return (f"algo {fields.get('algo_id')} {fields.get('math_type', '')} "
          f"knobs {{{knobs.group(1) if knobs else ''}}}")


def compiled_convolutions(hlo_text):
  """{convolution key: [algorithm, ...]} of a compiled program's text."""
  found = {}
  for line in hlo_text.splitlines():
    if '__cudnn$conv' in line and 'custom-call(' in line:
      found.setdefault(_instruction_key(line), []).append(_algorithm(line))
  return found


def differing_picks(hlo_text, saved):
  """{'compared': convolutions of the compiled program (its HLO text) that
  the saving steps compiled too (`saved`: saved_convolutions), 'differ':
  how many of those run another algorithm, 'unsaved': how many the saving
  steps had none of}."""
  compared = differ = unsaved = 0
  for key, algorithms in compiled_convolutions(hlo_text).items():
    if key not in saved:
      unsaved += len(algorithms)
      continue
    compared += len(algorithms)
    differ += sum((collections.Counter(algorithms) -
                   collections.Counter(saved[key])).values())
  return {'compared': compared, 'differ': differ, 'unsaved': unsaved}


def picks_line(counts, path):
  """The run's one line on its convolutions against the saved picks."""
  if not counts['compared'] and not counts['unsaved']:
    return f'Kernel picks: no cuDNN convolution in the step ({path})'
  return (f"Kernel picks: {counts['differ']} of {counts['compared']} "
          f"convolutions differ from the saved picks ({path}); "
          f"{counts['unsaved']} had none saved and were autotuned here")


_loaded = []


def keep(path):
  """Keeps the picks file this process gave XLA (prepare)."""
  _loaded[:] = [path]


def loaded():
  """The picks file this process gave XLA, or None."""
  return _loaded[0] if _loaded else None
