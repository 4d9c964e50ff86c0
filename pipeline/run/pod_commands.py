"""The shell commands launch.pod runs on a TPU slice's workers over ssh:
ending earlier runs, starting a run's trainer detached from its session,
following its log until its status is written. pod_slice.py runs them.
"""

import re
import shlex
from pipeline.launchers import Launcher

# What marks the trainers launch.pod starts, so that ending earlier runs
# ends theirs and nothing else on the worker: a variable naming the slice.
MARK = 'PIPELINE_POD'
# Trainers: `python -m launch.train` as the first words of a command line.
TRAINER = rf'python[^ ]* -m {re.escape(Launcher.TRAIN)}( |$)'


def signal_trainers(name, signal_name):
  """The shell command that sends SIG`signal_name` to every trainer that
  launch.pod started for the slice `name` on a worker."""
  mark = shlex.quote(f'{MARK}={name}')
  return (f"for p in $(pgrep -f '^[^ ]*{TRAINER}'); do "
          f"tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qxF {mark} "
          f'&& kill -{signal_name} $p; done; true')


def end_stale(name):
  """What ends earlier runs on a worker: launch.pod's trainers for this
  slice, whatever still holds the TPU's device files, libtpu's lock."""
  return (signal_trainers(name, 'KILL') + '; '
          "S=$([ \"$(id -u)\" = 0 ] || echo 'sudo -n'); "
          'if command -v fuser >/dev/null; then '
          '$S fuser -s -k -9 /dev/accel* /dev/vfio/[0-9]* 2>/dev/null; fi; '
          '$S rm -f /tmp/libtpu_lockfile; true')


# Where a worker's trainer writes its log and, when it ends, its status.
RUNS = '~/.launch-pod'


def _files(name, run_id=''):
  """A worker's log (one per slice name, to follow by hand), the file
  naming the run that last started there, and this run's status file:
  one per run, so that an earlier run's trainer, ended as the next one
  starts, writes its status where no follower of the next one reads."""
  base = f'{RUNS}/{shlex.quote(name)}'
  return f'{base}.log', f'{base}.run', f'{base}.{run_id}.status'


def log_file(name):
  """A worker's trainer log for the slice `name`, to follow by hand."""
  return _files(name)[0]


def _folder(repo_dir):
  """`repo_dir` for the worker's shell: a leading ~/ is its home."""
  home, _, rest = repo_dir.partition('~/')
  return f'~/{shlex.quote(rest)}' if not home and rest else shlex.quote(
      repo_dir)


def train_command(name, run_id, repo_dir, python, train_args, skip_bytes=0):
  """What each connection to a worker runs: unless the run `run_id` has
  started there already, the last run's files removed and the trainer
  started (in the foreground: both before the follower reads a byte),
  then its log followed from byte `skip_bytes` until its status is
  written. So a new run never
  reads the last one's log or status, and a connection lost before the
  trainer started starts it when it is made again.

  The trainer is the same launch.train on every worker, from the checkout,
  marked as the slice `name`'s, in a session of its own (a dropped ssh
  leaves it running); a missing checkout is the trainer's failure, in its
  log."""
  log, run_file, status = _files(name, run_id)
  trainer = (f'{{ cd {_folder(repo_dir)} && {MARK}={shlex.quote(name)} '
             f'{python} -m {Launcher.TRAIN} {shlex.join(train_args)}; }} '
             f'> {log} 2>&1; echo $? > {status}.tmp; mv {status}.tmp '
             f'{status}')
  return (f'mkdir -p {RUNS} || exit 1; '
          f'if [ "$(cat {run_file} 2>/dev/null)" != {run_id} ]; then '
          f'rm -f {log} {RUNS}/{shlex.quote(name)}.*.status*; : > {log}; '
          f'echo {run_id} > {run_file}; '
          f'setsid nohup bash -c {shlex.quote(trainer)} > /dev/null 2>&1 & '
          f'fi; ' + follow_command(name, run_id, skip_bytes))


# The last line a follower prints: the trainer's exit status, which its
# ssh's own status cannot carry apart from a dropped connection's 255.
ENDED = 'launch.pod: the trainer exited with status '


def follow_command(name, run_id, skip_bytes=0):
  """Follows a worker's trainer log from byte `skip_bytes` until the run's
  status is written, then prints it (ENDED) and exits with it."""
  log, _, status = _files(name, run_id)
  return (f'tail -c +{skip_bytes + 1} -f {log} & '
          f'while [ ! -e {status} ]; do sleep 1; done; sleep 1; kill $!; '
          # On a line of its own, the log's last line ended or not.
          f'[ -z "$(tail -c 1 {log})" ] || echo; '
          f'echo "{ENDED}$(cat {status})"; exit $(cat {status})')
