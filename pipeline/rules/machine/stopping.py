"""Stopping when asked: SIGTERM (a preemption, a VM's shutdown, `timeout`,
`docker stop`, a scheduler's cancel) and Ctrl-C (SIGINT).

A request that arrives while work can stop cleanly (`with armed(): ...`:
the training loop, launch.evaluate --follow, launch.compare waiting on a
run) is only recorded; that work asks `requested()` at its next boundary,
keeps what it must (a committed checkpoint) and raises `Stopped`
(pipeline/errors.py), which a launcher turns into one line and exit status
128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C), as a shell
reports a process the signal ended. A second request, or one that arrives
when nothing could be kept (start-up, the final export), stops the process
at once with one line and that status. Checkpoints commit atomically (pipeline/storage/checkpoint.py), so
stopping at once leaves the last committed one intact.

Importable without TensorFlow: the launchers call `install()` in their
first lines, so even a Ctrl-C during the imports ends in one line.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from pipeline.errors import Stopped  # pylint: disable=unused-import  # What the stopping work raises.

SIGNALS = (signal.SIGTERM, signal.SIGINT)
NAMES = {signal.SIGTERM: 'SIGTERM', signal.SIGINT: 'Ctrl-C'}


# How long a stopped process may take to end after its last line (threads,
# atexit work, the console filter's drain); past it, it ends regardless.
EXIT_BOUND_S = 30


class _State:
  installed = False  # install() ran: a thread watches for the signals.
  armed = 0  # How many armed() blocks are open.
  requested = None  # The first signal while armed.
  resume_hint = ''  # What a stop at once tells the user to do next.
  children = []  # Process ids that get every request (forwarding_to).


_state = _State()


def install():
  """Handles SIGTERM and Ctrl-C from now on: one line, never a traceback.
  From the main thread, before any other thread starts.

  A thread of its own reads them from Python's wakeup descriptor, where
  the C-level handler writes each signal's number as it arrives: Python
  runs its own handlers only between bytecodes of the main thread, which
  can sit for minutes in one compiled call (XLA compiling), and two Ctrl-Cs
  there would reach it as one.
  """
  read_end, write_end = os.pipe()
  os.set_blocking(write_end, False)
  signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
  _state.installed = True
  _set_handlers(_seen_by_the_watcher)
  threading.Thread(target=_watch, args=(read_end,), daemon=True,
                   name='stop-requests').start()


def reclaim():
  """After install(): installs the handlers again, over any a library put
  in since in native code (jax.distributed's preemption notifier takes
  SIGTERM); from the main thread."""
  if _state.installed:
    _set_handlers(_seen_by_the_watcher)


def _set_handlers(handler):
  """Python's handlers before."""
  return {signum: signal.signal(signum, handler) for signum in SIGNALS}


def _seen_by_the_watcher(signum, frame):
  del signum, frame  # _watch acts on it.


def _watch(read_end):
  while True:
    for signum in os.read(read_end, 64):
      if signum in SIGNALS:
        _request(signal.Signals(signum))


def requested():
  """The signal that asked this process to stop, or None."""
  return _state.requested


def _handle(signum, frame):
  # Where install() did not run (a notebook, a test calling the library):
  # Python's handler, in the main thread, between bytecodes. A Ctrl-C that
  # stops at once is Python's own KeyboardInterrupt there: the process is
  # the caller's, not ours to end.
  del frame
  if signum == signal.SIGINT and (_state.requested or not _state.armed):
    raise KeyboardInterrupt
  _request(signal.Signals(signum))


def _request(signum):
  # Only a flag, or a stop at once: no logging. A log line from Python's
  # handler would run inside whatever the main thread was doing, a buffered
  # write to stderr included, and fail there as a reentrant write.
  for pid in _state.children:
    try:
      os.kill(pid, signum)
    except OSError:
      pass  # It has just ended.
  if _state.armed and _state.requested is None:
    _state.requested = signum
    return
  _stop_now(signum)


def _stop_now(signum):
  again = ' again' if _state.requested else ''
  line = f'stopped: {NAMES.get(signum, signum)}{again}, at once'
  if _state.resume_hint:
    line += f'; {_state.resume_hint}'
  try:
    # A raw write: no lock a buffered stream could be holding here. On a
    # terminal, a fresh line (a progress bar may be on the current one).
    fd = sys.stderr.fileno()
    os.write(fd, f'{chr(10) if os.isatty(fd) else ""}{line}\n'.encode())
  except (OSError, ValueError):
    pass  # Nowhere left to say it; the exit status still does.
  os._exit(128 + int(signum))  # pylint: disable=protected-access


def exit_after(stopped):
  """Prints the Stopped line and ends the process with its status, within
  EXIT_BOUND_S whatever a thread or a library's teardown does."""
  exit_with(stopped.exit_status, str(stopped))


def exit_with(status, line):
  """Prints `line` and ends the process with `status` within EXIT_BOUND_S:
  jax.distributed's teardown waits minutes for a host that died."""
  sys.stderr.flush()
  # Through file descriptor 2, not sys.stderr: where the console filters
  # native lines (pipeline/run/environment.py) fd 2 is its pipe, so the line
  # lands after the native lines written before it (gRPC's, say) instead
  # of overtaking them on a busy machine; the last line stays the error.
  try:
    os.write(2, f'{line}\n'.encode())
  except OSError:  # The filter has ended.
    print(line, file=sys.stderr, flush=True)
  timer = threading.Timer(EXIT_BOUND_S, os._exit, (status,))
  timer.daemon = True
  timer.start()
  sys.exit(status)


def end_finished(status):
  """Ends a launcher whose work is done and saved with `status`, as Python's
  own exit would (threads that are not daemons joined, the atexit work:
  logging's flush, the console filter's drain, JAX's shutdown; then the
  standard streams flushed) but without its teardown, which frees
  TensorFlow's and Keras' objects one at a time: 1.7 s of CPU after a
  tiny run of 21. Whatever a run writes is closed or flushed by then
  (checkpoints, metrics; TensorBoard's writers flush as each `with
  writer.as_default()` block ends)."""
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and not thread.daemon:
      thread.join()
  import atexit  # pylint: disable=g-import-not-at-top
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  # mpi4py (JAX's join under Open MPI 5) finalizes MPI in Python's
  # teardown; mpirun fails a job whose process exits without it.
  mpi = sys.modules.get('mpi4py.MPI')
  if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
    mpi.Finalize()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass  # Closed, or its reader gone: nothing left to say.
  os._exit(status)  # pylint: disable=protected-access


# A process that ends its parent with a line unless killed first.
_WATCHDOG = ('import os, signal, sys, time\n'
             'time.sleep(float(sys.argv[2]))\n'
             'os.write(2, sys.argv[3].encode() + b"\\n")\n'
             'os.kill(int(sys.argv[1]), signal.SIGKILL)\n')


@contextlib.contextmanager
def within(seconds, line):
  """Ends this process with `line` (and SIGKILL's status) unless the block
  is done within `seconds`: for a join that blocks in native code, whose
  own timeout would abort the process with a stack dump (JAX) or never
  come (TensorFlow's workers waiting for a peer). A process, not a thread:
  TensorFlow's join holds Python's lock while it waits. Nothing of the
  run is written before a join."""
  watchdog = subprocess.Popen(
      [sys.executable, '-c', _WATCHDOG, str(os.getpid()), str(seconds), line],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
  try:
    yield
  finally:
    watchdog.kill()
    watchdog.wait()


def wait(seconds):
  """Sleeps up to `seconds`, less once a stop is requested."""
  deadline = time.monotonic() + seconds
  while _state.requested is None and time.monotonic() < deadline:
    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


@contextlib.contextmanager
def armed(resume_hint=''):
  """Within: the first SIGTERM or Ctrl-C is recorded for `requested()`; a
  second stops at once, its line ending with `resume_hint`.

  Installs the handlers for its duration where it can (the main thread),
  so a notebook or a test that calls the library directly gets the same
  behaviour as a launcher, and a handler a library took meanwhile is
  taken back; they are put back after.
  """
  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous = _set_handlers(_seen_by_the_watcher if _state.installed
                             else _handle)
  if not _state.armed:
    _state.requested = None
  _state.armed += 1
  hint, _state.resume_hint = _state.resume_hint, resume_hint
  try:
    yield
  finally:
    _state.armed -= 1
    _state.resume_hint = hint
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def forwarding_to(process):
  """Within: every stop request this process gets is passed on to the
  child `process` as it comes (the first, then a second that stops both at
  once). Start the child in its own process group, so that a terminal's
  Ctrl-C or a signal to this process group reaches it once, through here."""
  _state.children.append(process.pid)
  try:
    yield process
  finally:
    _state.children.remove(process.pid)
