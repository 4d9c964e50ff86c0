"""Process settings TensorFlow reads once, as it loads: set them before.

Importable without TensorFlow; the launchers call `prepare(sys.argv)` in
their first lines, before anything imports TensorFlow: it sets them, then
loads Keras (and through it TensorFlow or JAX) without its optional extras.
"""

import argparse
import atexit
import logging
import os
import re
import subprocess
import sys
import threading

from pipeline import backends
from pipeline.rules.machine import cluster as cluster_lib
from pipeline.rules.machine import hardware
from pipeline.rules.machine import placement
from pipeline.rules.machine import stopping
from pipeline.rules.speed import autotune
from pipeline.rules.speed import compile_cache
from pipeline.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Keras imports scikit-learn (for its sklearn wrappers), matplotlib (its
# plot utilities) and IPython (its notebook file editor) as it loads, each
# optional: an ImportError leaves that integration out. A run uses none of
# them through Keras, and they (SciPy's statistics with them) were a third of
# `import tensorflow, keras` on 2 cores (7.4 -> 4.9 s). The pipeline's own
# uses (scikit-learn's digits, the pictures of evaluate and compare) import
# them later, as usual.
KERAS_EXTRAS = ('sklearn', 'matplotlib', 'IPython')

# What TensorFlow's and libtpu's native code print at start-up on a machine
# without the hardware they probe, before any log level applies (they are
# written "before absl::InitializeLog() is called"): nothing about the run.
# A driver TensorFlow cannot use is caught in one line by devices.py.
NATIVE_NOISE = re.compile('|'.join([
    r'All log messages before absl::InitializeLog\(\) is called',
    r'Could not find cuda drivers on your machine',
    r'failed call to cuInit',
    r'oneDNN custom operations are on',
    r'This TensorFlow binary is optimized to use available CPU instructions',
    r'To enable the following instructions: .* rebuild TensorFlow',
    r'Unable to register cu(DNN|FFT|BLAS) factory',
    r'computation placer already registered',
    r'TF-TRT Warning: Could not find TensorRT',
]))
# What libtpu (TensorFlow's TPU build) prints when it finds no TPU: noise
# for a run that asked for none, hidden only then.
NO_TPU_NOISE = re.compile('|'.join([
    r'Failed to find host bounds for accelerator type',
    r'Logging before InitGoogle\(\) is written to STDERR',
    r'unexpected worker hostname .* TPU_WORKER_HOSTNAMES',
    r'=== Source Location Trace: ===',
    r'libtpu_init_utils\.cc',
    r'Failed to (get|read) .*metadata',
]))
# Native lines about the run that nobody needs on the console; they go to
# the run's log file (run.log) instead.
QUIET = re.compile('|'.join([
    # XLA drops tf.debugging asserts (Keras' own, in its metrics).
    r'assert_op\.cc:\d+\] Ignoring Assert operator',
    # XLA's GPU autotuner, timing kernels on a busy GPU.
    r'cuda_timer\.cc:\d+\] Delay kernel timed out',
    # TensorFlow tries text before binary when it loads a compiled program
    # from the compile cache (pipeline/rules/speed/compile_cache.py).
    r'text_format\.cc:\d+\] Error parsing text-format '
    r'tensorflow\.XlaSerializedCacheEntry',
    # A damaged or odd image: TensorFlow's JPEG decoder, and libjpeg's and
    # libpng's bare lines, none naming the file (ImageNet has a few). The
    # run counts the records it could not decode ("skipped records").
    r'jpeg_mem\.cc:\d+\] ',
    r'^(Corrupt JPEG data|Premature end of JPEG file|Input file read error|'
    r'Improper call to JPEG library|Not a JPEG file|Invalid JPEG file '
    r'structure|Unsupported marker type|libpng (warning|error): )',
]))
# A line this process writes to the filter: the log file for QUIET lines.
_LOG_MARKER = 'PIPELINE_NATIVE_LOG='
_filtering = []
_direct = []  # The real stderr's descriptor while the filter runs.

def _flag(argv, name):
  """The --NAME value in `argv` (absl syntax), or None if not given."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  parser.add_argument(f'--{name}', f'-{name}')
  known, _ = parser.parse_known_args(argv[1:])
  return getattr(known, name)


def requested_policy(argv):
  """The --policy value in `argv` (absl syntax), or None if not given."""
  return _flag(argv, 'policy')


def prepare(argv):
  """Sets TensorFlow's and Keras' load-time switches for the run `argv`
  asks for, then loads Keras (load_keras_without_extras); a one-line exit
  for a backend that cannot run. From here on, SIGTERM and Ctrl-C end the
  process in one line (pipeline/rules/machine/stopping.py)."""
  stopping.install()
  try:
    backends.prepare(_flag(argv, 'backend'), _flag(argv, 'tpu'))
    picks = prepare_autotune()
    prepare_compile_cache(_flag(argv, 'config.compile_cache_dir'),
                          picks=picks)
    bind_gpus()
  except UserError as e:
    sys.exit(f'error: {e}')
  # Warnings and errors from TensorFlow's C++ side; its INFO lines are noise.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  if not _flag(argv, 'tpu'):
    # No TPU asked for: libtpu (the TPU build) would spend minutes asking a
    # GCE metadata server that is not there, logging each retry.
    os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  # Only in a launcher run as a program: a process that imports one (a
  # test harness capturing stderr itself) keeps its stderr as it is.
  if os.path.abspath(argv[0] if argv else '').startswith(
      os.path.join(REPO, 'launch') + os.sep):
    filter_native_stderr(NATIVE_NOISE if _flag(argv, 'tpu') else re.compile(
        f'{NATIVE_NOISE.pattern}|{NO_TPU_NOISE.pattern}'))
  if requested_policy(argv) == 'rewrite':
    # --policy=rewrite on a CPU is oneDNN's bfloat16 rewrite, and TensorFlow
    # leaves oneDNN off on CPUs without AVX-512. An explicit 0 is kept: the
    # run then stops in one line (the TensorFlow backend's graph_rewrite.py).
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')
  load_keras_without_extras()


def load_keras_without_extras():
  """Imports Keras, and through it its backend, with KERAS_EXTRAS not yet
  loaded kept out (an import of one raises ImportError meanwhile); they
  import as usual afterwards."""
  absent = [name for name in KERAS_EXTRAS if name not in sys.modules]
  sys.modules.update(dict.fromkeys(absent))
  try:
    import keras  # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
  finally:
    for name in absent:
      if sys.modules.get(name, False) is None:
        del sys.modules[name]


# The filter: its own process, so lines a crash leaves in the pipe (a
# native "Check failed") still reach the screen after this one dies. It
# ignores the signals its run handles (a signal to the whole process group,
# as `timeout`, a VM's shutdown or a terminal's Ctrl-C send, must leave it
# to pass the run's last lines) and ends when the pipe closes.
_FILTER = """
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
noise, quiet, marker = re.compile(sys.argv[1]), re.compile(sys.argv[2]), sys.argv[3]
out, log, kept = sys.stdout.buffer, None, []
for line in sys.stdin.buffer:
  text = line.decode('utf-8', 'replace')
  if text.startswith(marker):
    if log:
      log.close()
    path = text[len(marker):].strip()
    log = open(path, 'ab') if path else None
    if log:
      log.writelines(kept)
      log.flush()
      kept = []
  elif noise.search(text):
    continue
  elif quiet.search(text):
    if log:
      log.write(line)
      log.flush()
    else:
      kept = kept[-999:] + [line]
  else:
    try:
      out.write(line)
      out.flush()
    except OSError:
      pass  # The terminal is gone; keep draining, so the run never blocks.
"""


def bind_gpus(environ=None, driver_gpus=None):
  """Leaves this process only its own GPUs, checked against what its engine
  gave its task (placement.bind), as CUDA_VISIBLE_DEVICES in `environ`
  (os.environ unless given) before TensorFlow or JAX load, and keeps the
  Binding for the plan; `driver_gpus` stands in for nvidia-smi's count
  (tests). TF_CONFIG's workers are the user's to place."""
  environ = os.environ if environ is None else environ
  found = None if environ.get('TF_CONFIG') else (
      cluster_lib.from_environment(environ))
  if driver_gpus is None:
    # Every GPU of the host, whatever is visible: where several processes
    # share it, whether each was given its own (placement.bind).
    driver_gpus = (hardware.nvidia_gpus() if placement.VISIBLE not in environ
                   or (found and found.local_size > 1) else 0)
  binding = placement.bind(found, environ, driver_gpus)
  if binding and (environ.get(placement.VISIBLE) is not None or
                  len(binding.entries) < driver_gpus):
    environ[placement.VISIBLE] = ','.join(binding.entries)
  placement.keep(binding)
  placement.keep_cpus(placement.starved_cpus(
      found, len(os.sched_getaffinity(0)), os.cpu_count() or 1))
  return binding


def prepare_autotune(environ=None, gpus=None):
  """On a GPU, has XLA load the convolution picks saved for this card and
  the backend's software (rules/speed/autotune.py: launch.probe
  --save_autotune keeps them) before TensorFlow or JAX load: every process
  then runs the same kernels. Returns the file's path, or None. `gpus`
  stands in for the driver's list."""
  gpus = backends.gpu_models() if gpus is None else gpus
  if not gpus:
    return None
  path, passed_over = autotune.prepare(
      gpus[0], backends.chosen()[0].software(),
      os.environ if environ is None else environ)
  for line in passed_over:
    logging.warning('%s', line)
  return path


def prepare_compile_cache(setting, environ=None, gpus=None, software=None,
                          picks=None):
  """Chooses and sets up this process's cache in `environ` (os.environ
  unless given), before TensorFlow or JAX load; returns the Settings, also
  kept for `chosen`. `gpus` and `software` stand in for this machine's
  (tests); None looks. `picks`: the autotune file XLA loads, whose hash
  the folder names, so a program compiled under other picks is never
  served."""
  environ = os.environ if environ is None else environ
  backend, _ = backends.chosen()
  gpus = backends.gpu_models() if gpus is None else gpus
  versions = (software or backend.software()) + (
      f'-picks-{autotune.digest_of(picks)}' if picks else '')
  settings = compile_cache.choose(setting or '', backend, environ, gpus,
                    bool(gpus) or backends.tpu_attached(), versions)
  if settings.environment:
    problem = _usable(settings.directory)
    if problem:
      settings = compile_cache.Settings(settings.setting, None, problem)
    else:
      environ.update(settings.environment)
  if settings.directory:
    backend.check_compile_cache(settings.directory)
  compile_cache.keep(settings)
  return settings


def _usable(folder):
  """Why `folder` cannot hold the cache, or None: TensorFlow fails the
  compile, not just the save, when it cannot write an entry."""
  probe = os.path.join(folder, f'.probe-{os.getpid()}')
  try:
    os.makedirs(folder, exist_ok=True)
    with open(probe, 'w', encoding='utf-8') as f:
      f.write('ok')
    os.remove(probe)
    return None
  except OSError as e:
    line = (f'compile cache off: cannot write {folder} ({e.strerror}); set '
            '--config.compile_cache_dir=DIR or =off')
    logging.warning('%s', line)
    return line


def filter_native_stderr(noise=NATIVE_NOISE):
  """Drops `noise` lines that native code writes to this process's stderr
  (file descriptor 2) and sends QUIET ones to the log file that
  `native_lines_to` names (kept until then); every other line passes, in
  order.

  Python's own output (logging, progress bars, tracebacks, a one-line
  error) goes straight to the real stderr through a new sys.stderr, so
  nothing waits on the filter but native lines. Should the filter end
  early (killed), native lines go straight to the real stderr from then on:
  a write to its closed pipe never raises. PIPELINE_RAW_STDERR=1 leaves
  stderr alone.
  """
  if os.environ.get('PIPELINE_RAW_STDERR') or _filtering:
    return
  _filtering.append(True)
  sys.stderr.flush()
  direct = os.dup(2)
  read_end, write_end = os.pipe()
  child = subprocess.Popen(
      [sys.executable, '-S', '-c', _FILTER, noise.pattern, QUIET.pattern,
       _LOG_MARKER],
      stdin=read_end, stdout=direct, stderr=direct)
  os.close(read_end)
  os.dup2(write_end, 2)
  os.close(write_end)
  sys.stderr = os.fdopen(direct, 'w', buffering=1, errors='backslashreplace')
  _direct.append(direct)

  def bypass_when_it_ends():
    child.wait()
    _bypass()

  threading.Thread(target=bypass_when_it_ends, daemon=True,
                   name='stderr-filter-watch').start()

  def drain():
    # At a normal exit: close our end and let the filter finish, so its
    # last lines land before the shell's prompt.
    try:
      _bypass()
      child.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
      pass  # A child process of ours still holds the pipe; it will end.

  atexit.register(drain)


def native_lines_to(path):
  """From now on QUIET native lines, and those kept so far, go to the file
  `path` (appended to); '' stops that. Nothing without the filter."""
  if _filtering and _direct:
    try:
      os.write(2, f'{_LOG_MARKER}{path}\n'.encode())
    except OSError:  # The filter has ended: nothing to tell it.
      _bypass()


def _bypass():
  """Native lines straight to the real stderr, the filter left out."""
  if _direct:
    os.dup2(_direct.pop(), 2)
