"""One command from a laptop or Cloud Shell trains on every worker of a
Cloud TPU VM slice, as Google's docs and big_vision do it (`gcloud compute
tpus tpu-vm ssh NAME --worker=all --command=...`), with what MaxText's
multihost_runner adds: earlier runs' processes that still hold the TPU are
ended first (the next run would hang on the TPU, jax#10192; the trainers it
starts carry a variable naming the slice, so nothing else is), each worker
writes its own log, worker 0's lines are shown as they come, and a worker
that fails is named and the others are stopped (SIGTERM: each commits a
checkpoint, as a preemption does).

Each trainer runs detached from its ssh session, writing its log and then
its exit status into ~/.launch-pod/ on its worker, while the session
follows the log. A connection that ends before the trainer's status is
read is no failed trainer: ssh's dropped connection (exit 255: a laptop
asleep, Cloud Shell reconnecting), gcloud's own failure (an API error, an
expired token) or an unreadable status. The launcher makes it again,
which starts the trainer where it had not started and follows it from
where it was; where it cannot, it says why (gcloud's message), that the
trainers still run and how to follow them, and stops nothing.

The workers join each other themselves (pipeline/rules/machine/cluster.py): JAX
reads the slice's hosts from the TPU VM's metadata.

Importable without TensorFlow: it only runs gcloud.
"""

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid

from pipeline.errors import UserError
from pipeline.rules.machine import stopping
from pipeline.run import pod_commands
from pipeline.run.pod_commands import ENDED

# ssh's own exit status for a connection that failed or dropped.
SSH_LOST = 255

@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU VM slice as gcloud names it."""
  name: str
  zone: str
  project: str = ''

  def gcloud(self, verb, *args):
    """The `gcloud compute tpus tpu-vm VERB NAME ...` command line."""
    return ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, self.name,
            f'--zone={self.zone}',
            *([f'--project={self.project}'] if self.project else []), *args]

  def ssh(self, worker, command):
    return self.gcloud('ssh', f'--worker={worker}', f'--command={command}')


def _gcloud(command, what):
  """Runs gcloud; its output, or a one-line UserError naming `what`."""
  try:
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=600, check=False)
  except FileNotFoundError:
    raise UserError('gcloud is not installed: run from a machine with the '
                    'Google Cloud CLI (Cloud Shell has it), or start '
                    '`python -m launch.train` on every worker') from None
  if result.returncode:
    last = (result.stderr.strip().splitlines() or ['no output'])[-1]
    raise UserError(f'gcloud could not {what} (exit {result.returncode}): '
                    f'{last}')
  return result.stdout


def workers(pod):
  """How many workers (hosts) the slice has."""
  described = json.loads(_gcloud(pod.gcloud('describe', '--format=json'),
                                 f'describe TPU {pod.name}') or '{}')
  count = len(described.get('networkEndpoints', []))
  if not count:
    raise UserError(f'TPU {pod.name} in {pod.zone} lists no workers (its '
                    f"state: {described.get('state', 'unknown')}); is it a "
                    'TPU VM, and READY?')
  return count


@dataclasses.dataclass
class _Worker:
  """One worker's trainer as the launcher follows it."""
  index: int
  log_path: str
  process: subprocess.Popen = None
  copying: tuple = ()  # The threads copying its stdout and its stderr.
  received: int = 0  # Bytes of the trainer's own log shown so far.
  reconnects: int = 0  # Since the last healthy stretch.
  followed_at: float = 0.0  # When the current connection began.
  ended: int = None  # The trainer's exit status, once its follower said.
  gcloud_said: str = ''  # The last line gcloud or ssh wrote (stderr).
  unreadable: bool = False  # Its follower's status line held no number.

  def status(self):
    """The trainer's exit status once its follower said it; None while
    the connection is up; else what ended the connection (_Lost)."""
    code = self.process.poll()
    if code is None:
      return None
    for thread in self.copying:  # Its last lines, ENDED among them.
      thread.join(timeout=10)
    return self.ended if self.ended is not None else _Lost(
        code, self.gcloud_said, self.unreadable)


@dataclasses.dataclass(frozen=True)
class _Lost:
  """A connection that ended before its follower said the trainer's
  status: ssh's dropped connection (255), gcloud's own failure (an API
  error, a quota, an expired token: any other status), or a status file
  that could not be read. None of them is the trainer's."""
  code: int
  said: str
  unreadable: bool

  def __str__(self):
    if self.unreadable:
      return "its trainer's status could not be read"
    if self.code == SSH_LOST:
      return f'the connection dropped (ssh exit {SSH_LOST})'
    return f'gcloud failed (exit {self.code}: {self.said or "no output"})'


# Times a lost connection to a worker is made again in a row; a
# connection that stayed up HEALTHY_S starts the count again.
RECONNECTS = 3
HEALTHY_S = 300


def run(pod, repo_dir, python, train_args, log_dir, stop_wait_s=300,
        out=sys.stdout, reconnect_wait_s=10, healthy_s=HEALTHY_S):
  """Trains on every worker of `pod`; returns the exit status: 0 when every
  worker finished, else the first trainer's failure (the others stopped),
  or, where a worker's connection could not be made again RECONNECTS times
  in a row, ssh's or gcloud's status (its trainers still run; a
  connection up `healthy_s` starts the count again). Workers stopped
  after a failure get `stop_wait_s` to commit."""
  count = workers(pod)
  os.makedirs(log_dir, exist_ok=True)
  print(f'TPU {pod.name}: {count} workers; ending earlier runs on each, '
        f'then training; one log per worker in {log_dir}', file=out,
        flush=True)
  _gcloud(pod.ssh('all', pod_commands.end_stale(pod.name)),
          'end earlier runs on the workers')
  run_id = uuid.uuid4().hex[:12]
  # Every connection sends the same command (pod_commands.train_command),
  # from the byte of the trainer's log shown so far.
  command = lambda worker: pod_commands.train_command(
      pod.name, run_id, repo_dir, python, train_args, worker.received)
  running = [_Worker(worker, os.path.join(log_dir, f'worker-{worker}.log'))
             for worker in range(count)]
  for worker in running:
    _follow(pod, worker, command(worker), out)
  with stopping.armed():
    status = _watch(pod, running, command, out, reconnect_wait_s, healthy_s)
    if status is None:  # Ctrl-C or SIGTERM here: stop every worker.
      status = 128 + int(stopping.requested())
    if isinstance(status, _Lost):
      return status.code or 1
    if any(worker.process.poll() is None for worker in running):
      _stop_all(pod, running, out, stop_wait_s)
  return status


def _follow(pod, worker, command, out):
  """Runs `command` on `worker` over ssh: the trainer's log (its stdout)
  appended to the worker's log (worker 0's also shown), gcloud's and ssh's
  own lines (its stderr) too, marked, and not counted as the log's."""
  worker.ended, worker.gcloud_said, worker.unreadable = None, '', False
  worker.process = subprocess.Popen(
      pod.ssh(worker.index, command), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, start_new_session=True)
  worker.followed_at = time.monotonic()
  lock = threading.Lock()
  worker.copying = (
      threading.Thread(target=_copy, daemon=True, args=(
          worker, out if worker.index == 0 else None, lock)),
      threading.Thread(target=_copy_gcloud, args=(worker, lock), daemon=True))
  for thread in worker.copying:
    thread.start()


def _copy(worker, out, lock):
  """The trainer's log as it comes, whole lines only; its follower's ENDED
  line kept apart (one that does not end in a number is no status: _Lost
  says so)."""
  for line in worker.process.stdout:
    if not line.endswith(b'\n'):
      # Cut off by a dropped connection (the follower ends the log's last
      # line itself): uncounted, so the next connection sends it whole,
      # and ssh's next line is not written onto it.
      break
    text = line.decode('utf-8', 'replace')
    if text.startswith(ENDED):
      try:
        worker.ended = int(text[len(ENDED):])
      except ValueError:
        worker.unreadable = True
      continue
    with lock, open(worker.log_path, 'ab') as log:
      log.write(line)
    worker.received += len(line)
    if out:
      out.write(text)
      out.flush()


def _copy_gcloud(worker, lock):
  for line in worker.process.stderr:
    with lock, open(worker.log_path, 'ab') as log:
      log.write(b'[gcloud] ' + line)
    if line.strip():
      worker.gcloud_said = line.decode('utf-8', 'replace').strip()


def _watch(pod, running, command, out, reconnect_wait_s, healthy_s):
  """Waits for every worker; the exit status of the first trainer that
  fails, 0 when all finish, a _Lost where a worker's connection cannot be
  made again, None when this process is asked to stop."""
  while stopping.requested() is None:
    for worker in running:
      code = worker.status()
      if isinstance(code, _Lost):
        if time.monotonic() - worker.followed_at >= healthy_s:
          worker.reconnects = 0
        if worker.reconnects == RECONNECTS:
          _lost(pod, worker, code, out)
          return code
        worker.reconnects += 1
        print(f'worker {worker.index}: {code}; following its trainer '
              f'again in {reconnect_wait_s:g} s ({worker.reconnects} of '
              f'{RECONNECTS} in a row)', file=out, flush=True)
        time.sleep(reconnect_wait_s)
        _follow(pod, worker, command(worker), out)
      elif code:
        print(f'error: worker {worker.index} exited with status {code} '
              f'({_last_line(worker.log_path)}); stopping the others; its '
              f'log: {worker.log_path}', file=out, flush=True)
        return code
    if all(worker.status() == 0 for worker in running):
      print(f'all {len(running)} workers finished', file=out, flush=True)
      return 0
    time.sleep(1)
  return None


def _lost(pod, worker, lost, out):
  log = pod_commands.log_file(pod.name)
  follow = shlex.join(pod.ssh(0, f'tail -f {log}'))
  print(f'error: could not follow worker {worker.index} ({lost}, '
        f'{RECONNECTS} times in a row); the trainers still run on every '
        'worker where they started and commit their checkpoints as usual. '
        f'Follow worker 0 with: {follow} (each worker logs to {log}); '
        'running this command again ends them and resumes from the last '
        'checkpoint. Run launch.pod where it can stay connected: tmux, or '
        'a VM', file=out, flush=True)


def _last_line(path):
  time.sleep(0.5)  # The copying thread's last lines.
  with open(path, encoding='utf-8', errors='replace') as log:
    lines = [line.strip() for line in log if line.strip()]
  return lines[-1] if lines else 'no output'


def _stop_all(pod, running, out, wait_s):
  """SIGTERM to every worker's trainer: each commits a checkpoint at its
  next step and exits, as on a preemption. One that has not ended within
  `wait_s` (a TensorFlow worker still waiting for its peers: TensorFlow's
  coordination service takes SIGTERM then) gets SIGKILL."""
  print(f'stopping every worker (SIGTERM: each commits a checkpoint within '
        f'{wait_s:g} s)', file=out, flush=True)
  _signal_trainers(pod, 'TERM')
  deadline = time.monotonic() + wait_s
  for worker in running:
    try:
      worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      print(f'worker {worker.index} did not stop within {wait_s:g} s: '
            'ending it (SIGKILL)', file=out, flush=True)
      _signal_trainers(pod, 'KILL')
      try:  # Its follower ends once the trainer's status is written.
        worker.process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait()


def _signal_trainers(pod, signal_name):
  subprocess.run(pod.ssh('all', pod_commands.signal_trainers(pod.name,
                                                             signal_name)),
                 capture_output=True, timeout=600, check=False)
