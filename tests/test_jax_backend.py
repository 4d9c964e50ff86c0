"""The same launcher on Keras' JAX backend, in the JAX environment.

Runs where requirements-jax-test.txt is installed (CI's third environment,
with TPU_SKIP_MDS_QUERY=1); skipped in an environment without JAX. Every
run is a real `python -m launch.train --backend=jax` over CPU devices: the
TPU it stands in for cannot exist here. XLA on this CPU compiles B0's
program for about a minute, so where the network is not what is tested a
run is B0's code at a fraction of its size (models.efficientnet_tiny), ten
steps of 32 images (conftest.jax_args). Runs read across the backends are
tests/test_across_backends.py's.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import check_progress_lines
from conftest import free_port
from conftest import jax_args
from conftest import REPO
from conftest import run_module
from conftest import run_train
from conftest import console_filter_of
from conftest import sigterm_groups_once_it_prints
from conftest import signal_once_it_prints
from conftest import stopped_at_one_step
from conftest import wait_until_gone

jax = pytest.importorskip('jax', reason='the JAX suite runs in the JAX '
                          'environment (requirements-jax-test.txt)')

from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipeline.rules.machine import stopping  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.parametrize('raised', [
    jax.errors.JaxRuntimeError('UNAVAILABLE: Task 1 heartbeat timeout'),
    # What process_allgather raised as a killed Slurm task's peer.
    ValueError('UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error '
               '[10.0.0.11]:37066: Connection reset by peer')])
def test_a_lost_host_is_one_line_whichever_error_jax_raises(raised,
                                                            monkeypatch):
  monkeypatch.setattr(devices, '_joined_by', ['Slurm (job 3)'])
  with pytest.raises(UserError, match=r'^another host \(Slurm \(job 3\)\) '
                     'stopped or never answered'):
    with devices.peers_lost_in_one_line():
      raise raised
  # Anything else is no lost host: it goes on as it was.
  with pytest.raises(ValueError, match='shapes differ'):
    with devices.peers_lost_in_one_line():
      raise ValueError('shapes differ')


def test_float16_trains_with_dynamic_loss_scaling_over_two_devices(
    tfds_dir, tmp_path):
  """T4s and V100s (compute capability 7.x) compute in float16: Keras'
  LossScaleOptimizer in the compiled program, its scale and skipped steps
  in the progress lines, TensorBoard and metrics.json as on TensorFlow.
  Starting at 2**15, the first steps may overflow and halve it."""
  workdir = tmp_path / 'run'
  result = run_train(*jax_args(workdir, tfds_dir, '--policy=mixed_float16'))
  assert result.returncode == 0, result.stderr[-3000:]
  assert ('Precision: mixed_float16 (asked for with --policy); loss scaling '
          'on') in result.stderr
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert (metrics['policy'], metrics['backend']) == ('mixed_float16', 'jax')
  scale, skipped = metrics['final_loss_scale'], metrics['skipped_steps']
  # Halved once per skipped step (no 2,000 good steps to double it here).
  assert scale == 2.0 ** 15 / 2 ** skipped and 0 <= skipped < 10
  assert f'loss scale {scale:g}, skipped steps {skipped}' in result.stderr
  assert math.isfinite(metrics['eval_loss'])
  tags = set()
  for path in (workdir / 'tensorboard' / 'train').glob('events.out.*'):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      tags.update(value.tag for value in event.summary.value)
  assert {'loss_scale', 'skipped_steps', 'grad_norm'} <= tags
  # The norm is the gradient's, the loss scale (2**15 or so) taken out.
  assert max(check_progress_lines(result.stderr, 10)) < 100


@pytest.mark.parametrize('flags, message', [
    (['--policy=rewrite'], "--policy=rewrite is TensorFlow's graph rewrite "
     'and runs on --backend=tensorflow only'),
    (['--xla=off'], '--xla=off: JAX compiles every program with XLA'),
    (['--backend=auto', '--tpu=local'], '--tpu=local: JAX finds no TPU on '
     'this host'),
    # Hardware not there, or a setting only TensorFlow honours (the rest of
    # them below, in this process: the same check raises them).
    (['--gpus=3'], "--gpus=3: '3' is not a visible GPU; visible GPUs: none"),
    (['TF_CONFIG'], 'TF_CONFIG joins TensorFlow workers; on the JAX backend '
     'hosts join through JAX_COORDINATOR_ADDRESS'),
])
def test_what_jax_cannot_do_here_is_one_line(flags, message, tfds_dir,
                                             tmp_path):
  env = {}
  if flags == ['TF_CONFIG']:  # Without --dry_run: the run itself stops.
    flags, env = [], {'TF_CONFIG': '{bad'}
  else:
    flags = ['--dry_run', *flags]
  result = run_train(*jax_args(tmp_path / 'run', tfds_dir), *flags, env=env)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and message in lines[-1], lines[-5:]
  assert 'Traceback' not in result.stderr
  if '--tpu=local' in flags:  # It chose JAX for the TPU, and said why.
    assert ('Backend: jax (--tpu=local and no TensorFlow TPU build is '
            'installed (tensorflow-tpu); Keras runs on JAX)') in result.stderr


@pytest.mark.parametrize('setting, message', [
    (dict(collective='ring'), "--collective=ring picks TensorFlow's "
     'all-reduce; on the JAX backend XLA chooses the collectives'),
    (dict(collective_timeout_s=60), "--collective_timeout_s bounds "
     "TensorFlow's collectives; on the JAX backend "
     'JAX_INITIALIZATION_TIMEOUT_S'),
    (dict(split_gpus=2), "--split_gpus=2 makes logical GPUs for "
     "TensorFlow's MirroredStrategy; JAX runs one replica per GPU"),
    (dict(tpu_runtime_version='2.12.0'), '--tpu_runtime_version=2.12.0 '
     'applies to TPU Nodes, which TensorFlow drives'),
    (dict(tpu_zone='us-central1-b'), '--tpu_zone=us-central1-b applies to '
     'TPU Nodes'),
    (dict(), None),
])
def test_each_setting_only_tensorflow_honours_is_named(setting, message):
  """The check that stops a JAX run on TF_CONFIG above, for each hardware
  flag only TensorFlow honours: the run raises its line as it does
  TF_CONFIG's."""
  from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top
  from pipeline.rules.config import request as request_lib  # pylint: disable=g-import-not-at-top
  problem = devices.unsupported_settings(request_lib.Request(**setting),
                                         environ={})
  if message is None:
    assert problem is None
  else:
    assert problem.startswith(message) and problem.endswith(
        'or pass --backend=tensorflow'), problem


def test_gpus_that_jax_cannot_see_stop_the_run_naming_the_fix(tfds_dir,
                                                             tmp_path):
  """A GPU VM with JAX's CPU-only jaxlib: one line, as TensorFlow's. No
  NVIDIA driver here: an `nvidia-smi` stand-in lists the GPUs."""
  folder = tmp_path / 'bin'
  folder.mkdir()
  (folder / 'nvidia-smi').write_text(
      '#!/bin/sh\nprintf "GPU 0: Tesla T4 (UUID: GPU-1)\\n"\n')
  (folder / 'nvidia-smi').chmod(0o755)
  path = f'{folder}{os.pathsep}{os.environ["PATH"]}'
  result = run_train(*jax_args(tmp_path / 'run', tfds_dir), '--dry_run',
                     env={'PATH': path})
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      'error: this machine has 1 NVIDIA GPU(s) (nvidia-smi -L) but JAX '
      f'{jax.__version__} sees none: no CUDA plugin is installed (this jaxlib runs on '
      'CPUs and TPUs); install requirements-gpu.txt (jax[cuda12]), or pass '
      '--allow_cpu to train on the CPU')
  allowed = run_train(*jax_args(tmp_path / 'run', tfds_dir), '--dry_run',
                      '--allow_cpu', env={'PATH': path})
  assert allowed.returncode == 0, allowed.stderr[-2000:]


def test_compare_passes_the_backend_to_its_runs(tfds_dir, tmp_path):
  """launch.compare's runs are launch.train processes: --backend=jax
  reaches them. A policy JAX refuses stops the run in its first lines, and
  compare names the run and its log (training two policies on JAX is
  minutes here; the table itself is test_compare.py's)."""
  root = tmp_path / 'compare'
  result = run_module('launch.compare', '--backend=jax', f'--workdir={root}',
                      f'--config.data_dir={tfds_dir}',
                      '--policies=rewrite', timeout=300)
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  # The failed run, named with its own error, then that none finished.
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 2, result.stderr[-2000:]
  refused = ("--policy=rewrite is TensorFlow's graph rewrite and runs on "
             '--backend=tensorflow only')
  assert errors[0].startswith(f'error: run rewrite failed (exit 1: error: '
                              f'{refused}')
  assert errors[1].startswith('error: no run finished')
  log = (root / 'rewrite' / 'train.log').read_text()
  assert 'Backend: jax (asked for with --backend=jax)' in log
  assert refused in log


def test_a_run_stops_on_ctrl_c_and_on_sigterm_to_its_group_and_resumes(
    tfds_dir, tmp_path):
  """As tests/test_stopping.py does on TensorFlow: each run in a process
  group of its own, the signal sent to the whole group (the run and its
  console filter), as a terminal and a VM's shutdown send it."""
  args = jax_args(tmp_path / 'run', tfds_dir,
               '--config.examples_per_epoch=3200')  # 100 steps.

  def stop_with(signum):
    run = subprocess.Popen([sys.executable, '-m', 'launch.train', *args],
                           cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, process_group=0)
    console_filter = console_filter_of(run)
    head = signal_once_it_prints(run, '(epoch ', signum, group=True)
    output = head + run.communicate(timeout=600)[1]
    wait_until_gone(console_filter, stopping.EXIT_BOUND_S)
    assert 'Traceback' not in output, output[-3000:]
    return run.returncode, output

  code, output = stop_with(signal.SIGINT)
  assert code == 130, output[-3000:]
  first = int(re.search(r'\nstopped: Ctrl-C: checkpoint of step (\d+) '
                        'committed', output).group(1))
  assert f'Ctrl-C: saving a checkpoint at step {first}' in output

  code, output = stop_with(signal.SIGTERM)
  assert code == 143, output[-3000:]
  assert f'Resuming at step {first} of 100' in output
  second = int(re.search(r'\npreempted: SIGTERM: checkpoint of step (\d+) '
                         'committed', output).group(1))
  assert second > first


# Two starts of two processes, 2-3 minutes here: the slow tier's. SIGTERM
# to every host at once (every VM shutting down) is the Slurm requeue's, on
# this backend too (tests/test_slurm.py).
@pytest.mark.slow
def test_two_hosts_stop_together_on_sigterm_and_resume(tfds_dir, tmp_path):
  """A pod slice's hosts, stood in for by two processes of one CPU device
  each (each in a process group of its own, as on its own VM), joined by
  jax.distributed over loopback (gloo collectives). SIGTERM to the second
  host's group stops both at one step (the requests are gathered at every
  execution boundary); restarted, both resume there and finish the run
  with equal weights."""
  workdir = tmp_path / 'run'

  def start():
    port = free_port()
    return [subprocess.Popen(
        [sys.executable, '-m', 'launch.train',
         *jax_args(workdir, tfds_dir, '--config.ema_decay=0',
                '--config.examples_per_epoch=640', devices=1)],  # 20 steps.
        cwd=REPO, env=dict(os.environ, JAX_NUM_PROCESSES='2',
                           JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                           JAX_PROCESS_ID=str(i)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        process_group=0)
            for i in range(2)]

  processes = start()
  outputs = sigterm_groups_once_it_prints(processes, 'First execution',
                                         [1])
  for output in outputs:
    assert 'with DataParallel, 2 replica(s) over 2 worker(s)' in output
  stopped = stopped_at_one_step(processes, outputs)
  assert 4 <= stopped < 20
  assert 'Another worker got SIGTERM' in outputs[0]
  assert 'This run got SIGTERM' in outputs[1]

  processes = start()
  outputs = [p.communicate(timeout=600)[1] for p in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-3000:]
    assert f'Resuming at step {stopped} of 20' in output
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert (metrics['num_workers'], metrics['num_replicas']) == (2, 2)
  assert metrics['initial_step'] == stopped
  digests = [re.search(r'weights sha256 (\w+)', o).group(1) for o in outputs]
  assert digests[0] == digests[1] == metrics['weights_sha256'][:16]
  # Only the first host wrote: its log holds two starts, one end.
  log = (workdir / 'run.log').read_text()
  assert log.count('] Run: ') == 2 and log.count('] Done: ') == 1


def _engine_variables(port):
  """What each launcher sets on its process `i` of two, on loopback."""
  return {
      # Kubeflow Trainer's jax-distributed runtime.
      'JAX_COORDINATOR_ADDRESS': lambda i: {
          'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port}',
          'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': str(i)},
      # XPK's GPU workloads.
      'XPK (NNODES, NODE_RANK)': lambda i: {
          'JAX_COORDINATOR_ADDRESS': '127.0.0.1',
          'JAX_COORDINATOR_PORT': str(port + 1), 'NNODES': '2',
          'NODE_RANK': str(i)},
      # A JobSet's manifest: the rank is the indexed Job's completion index.
      'a Kubernetes Job (JOB_COMPLETION_INDEX)': lambda i: {
          'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port + 2}',
          'JAX_NUM_PROCESSES': '2', 'JOB_COMPLETION_INDEX': str(i)},
      # Kubeflow Trainer's names, which JAX does not read (CPU workloads).
      'a Kubernetes Job (JOB_INDEX)': lambda i: {
          'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port + 3}',
          'PROCESSES_IN_JOB': '2', 'JOB_INDEX': str(i)},
  }


def test_every_launchers_variables_join_two_processes(tmp_path, tfds_dir):
  """The variables XPK, Kubeflow Trainer and an indexed Job inject (JAX
  does not read them all), set by the test: two dry runs per engine join
  on loopback and say how. (GKE's TPU variables JAX reads itself, where it
  finds a TPU: tests/test_cluster.py reads them.)
  Then a host that never starts: the one that did stops in one line naming
  the engine and the timeout, within it."""
  started = []
  for engine, variables in _engine_variables(free_port()).items():
    for i in range(2):
      env = dict(os.environ, **variables(i))
      started.append((engine, i, subprocess.Popen(
          [sys.executable, '-m', 'launch.train', '--dry_run',
           *jax_args(tmp_path / engine.split()[0], tfds_dir, devices=1)],
          cwd=REPO, env=env, stdout=subprocess.DEVNULL,
          stderr=subprocess.PIPE, text=True)))
  for engine, i, process in started:
    output = process.communicate(timeout=600)[1]
    assert process.returncode == 0, output[-3000:]
    assert (f'2 replica(s) over 2 worker(s); 2 processes joined by {engine}, '
            f'this is process {i}') in output, output[-3000:]

  alone = dict(os.environ, JAX_INITIALIZATION_TIMEOUT_S='5',
               **_engine_variables(free_port())['XPK (NNODES, NODE_RANK)'](0))
  began = time.monotonic()
  result = subprocess.run(
      [sys.executable, '-m', 'launch.train', '--dry_run',
       *jax_args(tmp_path / 'alone', tfds_dir, devices=1)], cwd=REPO, env=alone,
      capture_output=True, text=True, timeout=300)
  # The watchdog's SIGKILL: JAX's join holds the process in native code.
  assert result.returncode == -9 and 'Traceback' not in result.stderr
  assert ('error: could not join the other hosts through XPK (NNODES, '
          'NODE_RANK) within 5 s (JAX_INITIALIZATION_TIMEOUT_S)') in \
      result.stderr, result.stderr[-3000:]
  assert time.monotonic() - began < 120
