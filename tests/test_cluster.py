"""Which engine started a process, read from the variables each one sets
(pipeline/rules/cluster.py): pure functions, so every engine is covered here,
Kubernetes and Open MPI included, which cannot run on this machine. The
engines that can run here start real processes in tests/test_slurm.py and
tests/test_jax_backend.py."""

import pytest

from pipeline.errors import UserError
from pipeline.rules import cluster as cluster_lib

# What `srun -N 2 -n 4` sets in its last task (Slurm 22.05, block layout).
SLURM = {'SLURM_JOB_ID': '4101', 'SLURM_STEP_NODELIST': 'gpu[07-08]',
         'SLURM_NTASKS': '4', 'SLURM_PROCID': '3', 'SLURM_LOCALID': '1',
         'SLURM_NODEID': '1', 'SLURM_STEP_TASKS_PER_NODE': '2(x2)'}


def test_slurm_step():
  found = cluster_lib.from_environment(SLURM)
  assert (found.engine, found.num_processes, found.process_id) == (
      'Slurm', 4, 3)
  # JAX's own port rule: job id % 4096 above the ephemeral range.
  assert found.coordinator == 'gpu07:61445'
  assert found.hosts == ('gpu07', 'gpu07', 'gpu08', 'gpu08')
  assert (found.local_rank, found.local_size) == (1, 2)
  assert found.joined_by() == 'Slurm (job 4101)'
  workers = found.tensorflow_workers()
  assert workers[0].split(':')[0] == 'gpu07' and len(set(workers)) == 4
  # Two workers on one host, on neighbouring ports of this job's range.
  ports = [int(w.split(':')[1]) for w in workers]
  assert ports[1] == ports[0] + 1 and ports[2:] == ports[:2]
  other_job = cluster_lib.from_environment(dict(SLURM, SLURM_JOB_ID='4102'))
  assert not set(other_job.tensorflow_workers()) & set(workers)


def test_slurm_without_a_step_or_alone_is_no_cluster():
  batch_shell = {k: v for k, v in SLURM.items() if k != 'SLURM_STEP_NODELIST'}
  assert cluster_lib.from_environment(batch_shell) is None
  alone = dict(SLURM, SLURM_NTASKS='1', SLURM_PROCID='0',
               SLURM_STEP_TASKS_PER_NODE='1', SLURM_STEP_NODELIST='gpu07')
  assert cluster_lib.from_environment(alone) is None
  assert cluster_lib.from_environment({}) is None


@pytest.mark.parametrize('text, names', [
    ('vm', ['vm']),
    ('gpu[01-03,07],login', ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login']),
    ('a[9-11]-ib', ['a9-ib', 'a10-ib', 'a11-ib']),
    ('n[008-010]', ['n008', 'n009', 'n010']),
])
def test_slurm_host_lists(text, names):
  assert cluster_lib.expand_hostlist(text) == names


def test_slurm_tasks_per_node():
  assert cluster_lib.expand_counts('2(x3),1') == [2, 2, 2, 1]
  assert cluster_lib.expand_counts('8') == [8]


@pytest.mark.parametrize('environ, engine, count, rank, coordinator', [
    # Kubeflow Trainer's jax-distributed runtime, or set by hand.
    ({'JAX_COORDINATOR_ADDRESS': 'train-node-0-0.train:8476',
      'JAX_NUM_PROCESSES': '4', 'JAX_PROCESS_ID': '2'},
     'JAX_COORDINATOR_ADDRESS', 4, 2, 'train-node-0-0.train:8476'),
    # XPK on GPUs: the port apart, NNODES and NODE_RANK.
    ({'JAX_COORDINATOR_ADDRESS': 'xpk-0.xpk', 'JAX_COORDINATOR_PORT': '6002',
      'NNODES': '2', 'NODE_RANK': '1'},
     'XPK (NNODES, NODE_RANK)', 2, 1, 'xpk-0.xpk:6002'),
    # A JobSet or indexed Job whose manifest names the coordinator.
    ({'JAX_COORDINATOR_ADDRESS': 'js-w-0-0.js', 'JAX_NUM_PROCESSES': '2',
      'JOB_COMPLETION_INDEX': '1'},
     'a Kubernetes indexed Job (JOB_COMPLETION_INDEX)', 2, 1, 'js-w-0-0.js:8482'),
    # GKE's TPU node pools, older and newer variables, and two slices.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '3'},
     'GKE TPU', 4, 3, 'h0:8482'),
    ({'TPU_PROCESS_ADDRESSES': '10.0.0.5:8471,10.0.0.6:8471',
      'TPU_WORKER_ID': '1', 'MEGASCALE_NUM_SLICES': '2',
      'MEGASCALE_SLICE_ID': '1', 'MEGASCALE_COORDINATOR_ADDRESS': '10.0.0.1'},
     'GKE TPU', 4, 3, '10.0.0.1:8482'),
    # mpirun: JAX finds the coordinator from the launcher's address.
    ({'OMPI_MCA_orte_hnp_uri': '1531576320.0;tcp://10.96.0.1:34911',
      'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1',
      'OMPI_COMM_WORLD_LOCAL_RANK': '0', 'OMPI_COMM_WORLD_LOCAL_SIZE': '1'},
     'Open MPI', 2, 1, None),
])
def test_every_engine(environ, engine, count, rank, coordinator):
  found = cluster_lib.from_environment(environ)
  assert (found.engine, found.num_processes, found.process_id,
          found.coordinator) == (engine, count, rank, coordinator)


def test_what_a_user_sets_wins_over_the_engine():
  found = cluster_lib.from_environment(dict(
      SLURM, JAX_COORDINATOR_ADDRESS='10.1.1.1:1234', JAX_NUM_PROCESSES='2',
      JAX_PROCESS_ID='0'))
  assert found.engine == 'JAX_COORDINATOR_ADDRESS'


def test_a_single_tpu_host_is_no_cluster():
  assert cluster_lib.from_environment(
      {'TPU_WORKER_HOSTNAMES': 'localhost', 'TPU_WORKER_ID': '0'}) is None


@pytest.mark.parametrize('environ, message', [
    ({'JAX_COORDINATOR_ADDRESS': '10.0.0.1:1234'},
     'JAX_COORDINATOR_ADDRESS=10.0.0.1:1234 needs the number of processes'),
    ({'JAX_COORDINATOR_ADDRESS': '10.0.0.1', 'JAX_NUM_PROCESSES': 'two',
      'JAX_PROCESS_ID': '0'}, "JAX_NUM_PROCESSES='two' must be an integer"),
    ({'JAX_COORDINATOR_ADDRESS': '10.0.0.1', 'JAX_NUM_PROCESSES': '2',
      'JAX_PROCESS_ID': '2'}, 'process 2 is not among its 2 processes'),
])
def test_contradictions_in_one_line(environ, message):
  with pytest.raises(UserError, match=message):
    cluster_lib.from_environment(environ)


def test_gpu_share():
  alone = cluster_lib.Cluster('Slurm', 2, 0, local_size=1)
  assert cluster_lib.gpu_share(alone, 8) == list(range(8))
  assert cluster_lib.gpu_share(None, 4) == [0, 1, 2, 3]
  assert cluster_lib.gpu_share(alone, 0) is None
  # Two tasks on an 8-GPU host: four each, not JAX's one per local rank.
  second = cluster_lib.Cluster('Slurm', 4, 3, local_rank=1, local_size=2)
  assert cluster_lib.gpu_share(second, 8) == [4, 5, 6, 7]
  # `srun --gpus-per-task=1`: Slurm shows each task its own GPU.
  assert cluster_lib.gpu_share(second, 1) == [0]
  with pytest.raises(UserError, match='cannot share its 6 GPUs equally'):
    cluster_lib.gpu_share(
        cluster_lib.Cluster('Slurm', 4, 0, local_size=4), 6)
