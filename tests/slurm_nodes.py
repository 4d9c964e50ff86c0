"""A real Slurm of several nodes on this one machine, for tests/test_slurm.py.

Each node is its own network namespace (a veth pair into a bridge, an
address of its own) and its own host name (a UTS namespace), with its own
`slurmd -N NAME`; one `slurmctld` runs outside them. The names are in
/etc/hosts while the cluster runs. Each node has stand-in GPUs Slurm can
bind (generic resources of type gpu whose File= lines name character
devices made here): Slurm sets CUDA_VISIBLE_DEVICES per task as on a GPU
node, though no framework finds a GPU behind them.

Debian's Slurm 22.05 (slurmctld, slurmd, slurm-client), iproute2 and
util-linux, run as root, without munge (auth/none).
"""

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time

BRIDGE = 'slurmbr0'
SUBNET = '10.213.0'
HOSTS = '/etc/hosts'
_MARK = '# tests/slurm_nodes.py'
# Held while a cluster runs: the bridge, namespaces and host names are
# machine-wide, so two test processes take turns, and whatever the lock's
# holder finds is a killed run's leftovers (its lock went with it).
_LOCK = '/run/slurm_nodes.lock'


def missing():
  """Why the cluster cannot start here, or None."""
  import shutil  # pylint: disable=g-import-not-at-top
  absent = [name for name in ('slurmctld', 'slurmd', 'srun', 'sbatch', 'ip',
                              'nsenter', 'unshare', 'mknod')
            if not shutil.which(name)]
  if absent:
    return (f'{", ".join(absent)} not installed: apt-get install slurmctld '
            'slurmd slurm-client iproute2')
  if os.geteuid():
    return 'Slurm nodes in network namespaces need root'
  return None


def _run(*command):
  subprocess.run(command, check=True, capture_output=True, text=True)


def _config(root, nodes, gpus, port):
  """slurm.conf and gres.conf for `nodes` (name, address) of `gpus` each."""
  # Eight CPUs a node, whatever this machine has, so a test can start one
  # task per stand-in GPU; slurmd is told to take the figure as given.
  cpus = max(8, os.cpu_count())
  (root / 'gres.conf').write_text(''.join(
      f'NodeName={name} Name=gpu File=/dev/slurmtestgpu[0-{gpus - 1}]\n'
      for name, _ in nodes))
  (root / 'slurm.conf').write_text('\n'.join([
      'ClusterName=test',
      f'SlurmctldHost={socket.gethostname()}({SUBNET}.1)',
      'SlurmUser=root', 'SlurmdUser=root', 'AuthType=auth/none',
      'CredType=cred/none', 'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none', 'MpiDefault=none',
      'SelectType=select/cons_tres', 'SelectTypeParameters=CR_CPU',
      'ReturnToService=2', 'GresTypes=gpu', 'SlurmdParameters=config_overrides',
      f'SlurmctldPort={port}',
      f'SlurmdPort={port + 1}', f'StateSaveLocation={root}/state',
      f'SlurmdSpoolDir={root}/spool-%n',
      f'SlurmctldPidFile={root}/slurmctld.pid',
      f'SlurmdPidFile={root}/slurmd-%n.pid',
      f'SlurmctldLogFile={root}/slurmctld.log',
      f'SlurmdLogFile={root}/slurmd-%n.log',
      # What a site gives tasks between SIGTERM and SIGKILL (default 30 s);
      # JAX's steps on this CPU take seconds each.
      'KillWait=60',
      # A requeued job waits out the credentials' lifetime (120 s by
      # default) before it starts again.
      'AuthInfo=cred_expire=10', 'MinJobAge=600',
      # Then it waits for the scheduler's next pass, every 60 s (30 for
      # backfill) by default: JAX's tasks started again 43 s after a
      # requeue so, 14 s with passes every 2 s.
      'SchedulerParameters=sched_interval=2,bf_interval=2',
      *(f'NodeName={name} NodeAddr={address} CPUs={cpus} Gres=gpu:{gpus} '
        'State=UNKNOWN' for name, address in nodes),
      'PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP '
      'OverSubscribe=YES', '']))
  for state in ['state'] + [f'spool-{name}' for name, _ in nodes]:
    (root / state).mkdir(exist_ok=True)


def _remove(nodes):
  """Takes the bridge, the nodes' namespaces and their host names away,
  whichever exist."""
  with open(HOSTS, encoding='utf-8') as f:
    lines = f.readlines()
  if any(_MARK in line for line in lines):
    with open(HOSTS, 'w', encoding='utf-8') as f:
      f.writelines(line for line in lines if _MARK not in line)
  for name, _ in nodes:
    subprocess.run(['ip', 'netns', 'delete', name], capture_output=True,
                   check=False)
  subprocess.run(['ip', 'link', 'delete', BRIDGE], capture_output=True,
                 check=False)


@contextlib.contextmanager
def _network(nodes):
  """A bridge with an address, each node a namespace on it; their names in
  /etc/hosts. Removed after, and before if a killed run left them."""
  with open(_LOCK, 'w', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    _remove(nodes)
    try:
      _run('ip', 'link', 'add', BRIDGE, 'type', 'bridge')
      _run('ip', 'addr', 'add', f'{SUBNET}.1/24', 'dev', BRIDGE)
      _run('ip', 'link', 'set', BRIDGE, 'up')
      for index, (name, address) in enumerate(nodes):
        _run('ip', 'netns', 'add', name)
        _run('ip', 'link', 'add', f'slurmv{index}', 'type', 'veth', 'peer',
             'name', 'eth0', 'netns', name)
        _run('ip', 'link', 'set', f'slurmv{index}', 'master', BRIDGE, 'up')
        for command in (['addr', 'add', f'{address}/24', 'dev', 'eth0'],
                        ['link', 'set', 'eth0', 'up'],
                        ['link', 'set', 'lo', 'up']):
          _run('ip', '-n', name, *command)
      with open(HOSTS, 'a', encoding='utf-8') as f:
        f.writelines(f'{address} {name} {_MARK}\n' for name, address in nodes)
      yield
    finally:
      _remove(nodes)


@contextlib.contextmanager
def cluster(root, num_nodes=2, gpus=4):
  """Starts `num_nodes` Slurm nodes of `gpus` stand-in GPUs each; yields
  the environment Slurm's commands need (SLURM_CONF, this Python first on
  PATH) and stops everything after."""
  nodes = [(f'slurmnode{i}', f'{SUBNET}.{10 + i}') for i in range(num_nodes)]
  for index in range(gpus):
    path = f'/dev/slurmtestgpu{index}'
    if not os.path.exists(path):
      _run('mknod', path, 'c', '1', '3')  # A character device (null's).
  from conftest import free_port  # pylint: disable=g-import-not-at-top
  _config(root, nodes, gpus, free_port())
  env = dict(os.environ, SLURM_CONF=str(root / 'slurm.conf'),
             PATH=f'{os.path.dirname(sys.executable)}{os.pathsep}'
                  f'{os.environ["PATH"]}')
  with _network(nodes):
    daemons = [subprocess.Popen(['slurmctld', '-D', '-f', env['SLURM_CONF']],
                                env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)]
    for name, _ in nodes:
      daemons.append(subprocess.Popen(
          ['nsenter', f'--net=/var/run/netns/{name}', 'unshare', '--uts',
           'sh', '-c', f'hostname {name} && exec slurmd -D -N {name} -f '
           f'{env["SLURM_CONF"]}'], env=env, stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL))
    try:
      _wait_until_up(env, num_nodes, root)
      yield env
    finally:
      subprocess.run(['scancel', '--user=root'], env=env, check=False,
                     capture_output=True)
      for daemon in daemons:
        daemon.terminate()
      for daemon in daemons:
        daemon.wait(timeout=90)


def _wait_until_up(env, num_nodes, root):
  deadline = time.monotonic() + 90
  while subprocess.run(['srun', '-N', str(num_nodes), 'true'], env=env,
                       capture_output=True, timeout=60).returncode:
    if time.monotonic() > deadline:
      raise AssertionError('the Slurm nodes did not answer: ' + ''.join(
          path.read_text()[-1500:] for path in sorted(root.glob('*.log'))))
    time.sleep(1)
