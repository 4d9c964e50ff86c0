"""Which engine started a process, read from the variables each one sets
(pipeline/rules/machine/cluster.py): pure functions, so every engine is
covered here, Kubernetes and Open MPI included, which cannot run on this
machine. The engines that can run here start real processes in tests/test_slurm.py and
tests/test_jax_backend.py."""

import os
import re
import shutil
import subprocess

import pytest

from pipeline.errors import UserError
from pipeline.rules.machine import cluster as cluster_lib
from pipeline.rules.machine import slurm_variables
from pipeline.rules.machine import placement

# What `srun -N 2 -n 4` sets in its last task (Slurm 22.05, block layout).
SLURM = {'SLURM_JOB_ID': '4101', 'SLURM_STEP_NODELIST': 'gpu[07-08]',
         'SLURM_NTASKS': '4', 'SLURM_PROCID': '3', 'SLURM_LOCALID': '1',
         'SLURM_NODEID': '1', 'SLURM_STEP_TASKS_PER_NODE': '2(x2)'}


def test_slurm_step():
  found = cluster_lib.from_environment(SLURM)
  assert (found.engine, found.num_processes, found.process_id) == (
      'Slurm', 4, 3)
  assert found.jax_detects == 'slurm'  # JAX reads Slurm's variables itself.
  assert (found.local_rank, found.local_size) == (1, 2)
  assert found.joined_by() == 'Slurm (job 4101)'


def test_slurm_workers_for_tensorflow():
  workers = cluster_lib.from_environment(SLURM).tensorflow_workers()
  assert [w.split(':')[0] for w in workers] == ['gpu07', 'gpu07', 'gpu08',
                                                'gpu08']
  # Two workers on one host, on neighbouring ports of this job's range.
  ports = [int(w.split(':')[1]) for w in workers]
  assert ports[1] == ports[0] + 1 and ports[2:] == ports[:2]
  other_job = cluster_lib.from_environment(dict(SLURM, SLURM_JOB_ID='4102'))
  assert not set(other_job.tensorflow_workers()) & set(workers)



@pytest.mark.parametrize('layout, per_node, hosts', [
    ('block', '2(x2)', ['n07', 'n07', 'n08', 'n08']),
    ('cyclic', '2(x2)', ['n07', 'n08', 'n07', 'n08']),
    ('cyclic:block', '3,1', ['n07', 'n08', 'n07', 'n07']),
])
def test_tensorflow_workers_follow_slurms_layout(layout, per_node, hosts):
  """Each task's host as `srun -m LAYOUT` placed it, checked against the
  node it runs on (SLURMD_NODENAME)."""
  environ = dict(SLURM, SLURM_STEP_NODELIST='n[07-08]',
                 SLURM_STEP_TASKS_PER_NODE=per_node,
                 SLURM_DISTRIBUTION=layout, SLURMD_NODENAME=hosts[3])
  workers = cluster_lib.from_environment(environ).tensorflow_workers()
  assert [w.split(':')[0] for w in workers] == hosts



@pytest.mark.parametrize('environ, message', [
    ({'SLURM_DISTRIBUTION': 'plane=2'},
     'Slurm placed the tasks by SLURM_DISTRIBUTION=plane=2, which '
     "TensorFlow's workers cannot follow: srun -m block or -m cyclic"),
    ({'SLURM_HOSTFILE': '/tmp/hosts'},
     'Slurm placed the tasks by a host file (SLURM_HOSTFILE)'),
    ({'SLURMD_NODENAME': 'gpu07'},
     'Slurm placed process 3 on gpu07, where its layout puts it on gpu08'),
])
def test_a_layout_tensorflow_cannot_follow_is_one_line(environ, message):
  with pytest.raises(UserError, match=re.escape(message)):
    cluster_lib.from_environment(dict(SLURM, **environ)).tensorflow_workers()


def test_a_lone_task_is_a_cluster_of_one_and_a_batch_shell_none():
  """A single task of a step joins nobody (the JAX backend starts no
  coordinator for it); `sbatch`'s own shell is no step."""
  batch_shell = {k: v for k, v in SLURM.items() if k != 'SLURM_STEP_NODELIST'}
  assert cluster_lib.from_environment(batch_shell) is None
  alone = dict(SLURM, SLURM_NTASKS='1', SLURM_PROCID='0', SLURM_LOCALID='0',
               SLURM_STEP_TASKS_PER_NODE='1', SLURM_STEP_NODELIST='gpu07')
  assert cluster_lib.from_environment(alone).num_processes == 1
  assert cluster_lib.from_environment({}) is None


# Slurm's node-list forms and what `scontrol show hostnames` makes of each.
NODE_LISTS = {
    'n[1-3,5]': ['n1', 'n2', 'n3', 'n5'],
    'gpu-a[01-02],gpu-b7': ['gpu-a01', 'gpu-a02', 'gpu-b7'],
    'node[001-010]': [f'node{i:03d}' for i in range(1, 11)],
    # Ranges in two places, padding kept, and a padded range that widens.
    'rack[1-2]-n[08-10]': ['rack1-n08', 'rack1-n09', 'rack1-n10',
                           'rack2-n08', 'rack2-n09', 'rack2-n10'],
    'gpu[01-03,07],login': ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login'],
    'n[098-101]': ['n098', 'n099', 'n100', 'n101'],
}


@pytest.mark.parametrize('node_list', NODE_LISTS)
def test_slurm_node_lists_expand_without_scontrol(node_list, monkeypatch):
  """Node lists expand with no Slurm command on PATH (a task inside a
  container has none)."""
  monkeypatch.setenv('PATH', '/nonexistent')
  assert slurm_variables.hostnames(node_list) == NODE_LISTS[node_list]


@pytest.mark.skipif(not shutil.which('scontrol'),
                    reason='compared with Slurm where it is installed')
def test_node_lists_expand_as_scontrol_expands_them(tmp_path, monkeypatch):
  conf = tmp_path / 'slurm.conf'
  conf.write_text('ClusterName=t\nSlurmctldHost=localhost\n'
                  'NodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL\n')
  monkeypatch.setenv('SLURM_CONF', str(conf))
  for node_list, names in NODE_LISTS.items():
    expanded = subprocess.run(['scontrol', 'show', 'hostnames', node_list],
                              capture_output=True, text=True, check=True)
    assert expanded.stdout.split() == names


def test_a_node_list_that_does_not_expand_is_one_line():
  with pytest.raises(UserError, match=r"Slurm's node list 'n\[1-' does not "
                     r'expand \(.*\); expected names and ranges'):
    slurm_variables.hostnames('n[1-')


def test_slurm_tasks_per_node():
  assert slurm_variables.expand_counts('2(x3),1') == [2, 2, 2, 1]
  assert slurm_variables.expand_counts('8') == [8]


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
     'a Kubernetes Job (JOB_COMPLETION_INDEX)', 2, 1, 'js-w-0-0.js:8482'),
    # Kubeflow Trainer's and JobSet's own names, CPU workloads included.
    ({'JAX_COORDINATOR_ADDRESS': 'tj-node-0-0.tj', 'PROCESSES_IN_JOB': '3',
      'JOB_INDEX': '2'}, 'a Kubernetes Job (JOB_INDEX)', 3, 2, 'tj-node-0-0.tj:8482'),
    ({'JAX_COORDINATOR_ADDRESS': '10.0.0.2:1234', 'JAX_PROCESS_COUNT': '2',
      'JAX_PROCESS_ID': '1'}, 'JAX_COORDINATOR_ADDRESS', 2, 1, '10.0.0.2:1234'),
    # GKE's TPU node pools, older and newer variables, and two slices.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '3'},
     'GKE TPU', 4, 3, None),
    ({'TPU_PROCESS_ADDRESSES': '10.0.0.5:8471,10.0.0.6:8471',
      'TPU_WORKER_ID': '1', 'MEGASCALE_NUM_SLICES': '2',
      'MEGASCALE_SLICE_ID': '1', 'MEGASCALE_COORDINATOR_ADDRESS': '10.0.0.1'},
     'GKE TPU', 4, 3, None),
    # mpirun: JAX finds the coordinator from the launcher's address.
    ({'OMPI_MCA_orte_hnp_uri': '1531576320.0;tcp://10.96.0.1:34911',
      'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1',
      'OMPI_COMM_WORLD_LOCAL_RANK': '0', 'OMPI_COMM_WORLD_LOCAL_SIZE': '1'},
     'Open MPI 4', 2, 1, None),
    # Open MPI 5 (PRRTE): no launcher URI, the COMM_WORLD variables.
    ({'OMPI_COMM_WORLD_SIZE': '4', 'OMPI_COMM_WORLD_RANK': '2',
      'OMPI_COMM_WORLD_LOCAL_RANK': '0', 'PMIX_RANK': '2'},
     'Open MPI 5', 4, 2, None),
])
def test_every_engine(environ, engine, count, rank, coordinator):
  found = cluster_lib.from_environment(environ)
  assert (found.engine, found.num_processes, found.process_id,
          found.coordinator) == (engine, count, rank, coordinator)
  # JAX's own detection where it has one: Open MPI 4's launcher URI; Open
  # MPI 5 through mpi4py (jax 0.10's 'ompi' needs the URI).
  assert found.jax_detects == {'GKE TPU': 'gketpu', 'Open MPI 4': 'ompi',
                               'Open MPI 5': 'mpi4py'}.get(engine)


def test_mpirun_inside_a_slurm_allocation_is_open_mpi():
  """`mpirun` in an sbatch script: its ranks carry the job's Slurm
  variables (a step's, where mpirun started its daemons with srun) and
  Open MPI's; Open MPI's are the ranks', as JAX reads them."""
  found = cluster_lib.from_environment(dict(
      SLURM, OMPI_MCA_orte_hnp_uri='1.0;tcp://10.0.0.1:1', OMPI_COMM_WORLD_SIZE='8',
      OMPI_COMM_WORLD_RANK='5', OMPI_COMM_WORLD_LOCAL_RANK='1',
      OMPI_COMM_WORLD_LOCAL_SIZE='4'))
  assert (found.engine, found.num_processes, found.process_id,
          found.jax_detects) == ('Open MPI 4', 8, 5, 'ompi')


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


def _bound(environ, driver_gpus=0, **slurm):
  """placement.bind for the last task of SLURM with `slurm` on top."""
  found = cluster_lib.from_environment(dict(SLURM, **slurm))
  return placement.bind(found, environ, driver_gpus)


# What Slurm 22.05 sets for the last task of `srun -N 2 --ntasks-per-node=2`
# with each binding (read on tests/slurm_nodes.py's nodes), and the GPUs
# that task keeps: (variables, driver's count, entries kept, why).
@pytest.mark.parametrize('slurm, driver, kept, why', [
    # --gpus-per-task=1: Slurm shows each task its own.
    ({'SLURMD_TRES_BIND': 'gpu:per_task:1', 'SLURM_GPUS_ON_NODE': '2',
      'CUDA_VISIBLE_DEVICES': '1'}, 0, ('1',),
     'bound to this task by Slurm: --gpus-per-task=1'),
    # --gpus-per-task=2.
    ({'SLURMD_TRES_BIND': 'gpu:per_task:2', 'SLURM_GPUS_ON_NODE': '4',
      'CUDA_VISIBLE_DEVICES': '2,3'}, 0, ('2', '3'),
     'bound to this task by Slurm: --gpus-per-task=2'),
    # --gpus-per-task=2 --gpu-bind=none: no CUDA_VISIBLE_DEVICES; the
    # driver shows the node's 4 (as cgroups leave them) to both tasks.
    ({'SLURMD_TRES_BIND': 'gpu:none', 'SLURM_GPUS_PER_TASK': '2',
      'SLURM_GPUS_ON_NODE': '4'}, 4, ('2', '3'),
     'its share of 4, by local rank 1 of 2: --gpus-per-task=2; Slurm bound '
     'none (gpu:none)'),
    # --gpus-per-node=4, two tasks a node: both shown all four.
    ({'SLURM_GPUS_ON_NODE': '4', 'CUDA_VISIBLE_DEVICES': '0,1,2,3'}, 0,
     ('2', '3'),
     "its share of 4, by local rank 1 of 2: 2 of the node's 4 "
     '(SLURM_GPUS_ON_NODE) for each of its 2 tasks; Slurm bound none'),
    # --gpu-bind=closest where it does isolate: each its two.
    ({'SLURMD_TRES_BIND': 'gpu:closest', 'SLURM_GPUS_ON_NODE': '4',
      'CUDA_VISIBLE_DEVICES': '2,3'}, 0, ('2', '3'),
     "bound to this task by Slurm: 2 of the node's 4 (SLURM_GPUS_ON_NODE) "
     'for each of its 2 tasks'),
])
def test_each_task_keeps_the_gpus_slurm_gave_it(slurm, driver, kept, why):
  environ = {k: v for k, v in slurm.items() if k == 'CUDA_VISIBLE_DEVICES'}
  found = _bound(environ, driver, **slurm)
  assert (found.entries, found.why) == (kept, why)


def test_a_task_shown_other_gpus_than_it_was_given_is_one_line():
  with pytest.raises(UserError, match=re.escape(
      'Slurm gave this task 2 GPU(s) (--gpus-per-task=2), but it is shown 3 '
      '(CUDA_VISIBLE_DEVICES=0,1,2): neither its own 2 nor the 4 of the 2 '
      'tasks on this node')):
    _bound({'CUDA_VISIBLE_DEVICES': '0,1,2'}, SLURM_GPUS_PER_TASK='2')
  # Its node's GPUs do not split over its tasks.
  with pytest.raises(UserError, match=re.escape(
      'Slurm gave this node 3 GPUs (SLURM_GPUS_ON_NODE) for 2 tasks '
      '(SLURM_STEP_TASKS_PER_NODE), which cannot share them equally')):
    _bound({'CUDA_VISIBLE_DEVICES': '0,1,2'}, SLURM_GPUS_ON_NODE='3')
  # One task a node, shown more than the node was given (no cgroups).
  alone = dict(SLURM_NTASKS='2', SLURM_PROCID='1', SLURM_LOCALID='0',
               SLURM_STEP_TASKS_PER_NODE='1(x2)', SLURM_GPUS_ON_NODE='4')
  with pytest.raises(UserError, match=re.escape(
      'Slurm gave this node 4 GPU(s) (SLURM_GPUS_ON_NODE) for its one task, '
      'which is shown 8 (nvidia-smi -L: 8)')):
    _bound({}, 8, **alone)
  assert _bound({}, 4, **alone).entries == ('0', '1', '2', '3')


def test_gpus_without_an_engine_that_gives_them():
  assert placement.bind(None, {}, 4).entries == ('0', '1', '2', '3')
  assert placement.bind(None, {}, 0) is None
  assert placement.bind(None, {'CUDA_VISIBLE_DEVICES': ''}, 4) is None
  # mpirun's two ranks on an 8-GPU host: four each, not JAX's one per
  # local rank.
  second = cluster_lib.from_environment({
      'OMPI_COMM_WORLD_SIZE': '4', 'OMPI_COMM_WORLD_RANK': '3',
      'OMPI_COMM_WORLD_LOCAL_RANK': '1', 'OMPI_COMM_WORLD_LOCAL_SIZE': '2'})
  found = placement.bind(second, {}, 8)
  assert found.entries == ('4', '5', '6', '7')
  assert found.line({'CUDA_VISIBLE_DEVICES': '4,5,6,7'}) == (
      'GPUs 4,5,6,7 (its share of 8, by local rank 1 of 2: Open MPI 5 binds '
      'no GPUs; CUDA_VISIBLE_DEVICES=4,5,6,7 of nvidia-smi -L: 8)')
  with pytest.raises(UserError, match=re.escape(
      '2 processes on this host (OMPI_COMM_WORLD_LOCAL_SIZE) cannot share '
      'its 3 GPUs (nvidia-smi -L: 3) equally')):
    placement.bind(second, {}, 3)


def test_the_launcher_leaves_a_process_only_its_own_gpus(monkeypatch):
  """environment.bind_gpus narrows CUDA_VISIBLE_DEVICES before a framework
  loads, and keeps the line the plan prints."""
  from pipeline.run import environment  # pylint: disable=g-import-not-at-top
  environ = dict(SLURM, SLURM_GPUS_ON_NODE='4',
                 CUDA_VISIBLE_DEVICES='0,1,2,3')
  environment.bind_gpus(environ, driver_gpus=0)
  assert environ['CUDA_VISIBLE_DEVICES'] == '2,3'
  assert placement.chosen().line(environ).startswith(
      'GPUs 2,3 (its share of 4, by local rank 1 of 2: ')
  assert placement.chosen().line(environ).endswith(
      '; CUDA_VISIBLE_DEVICES=2,3 of CUDA_VISIBLE_DEVICES=0,1,2,3)')
  # Alone with every GPU it is shown: nothing to narrow, nothing set.
  environ = {}
  environment.bind_gpus(environ, driver_gpus=2)
  assert 'CUDA_VISIBLE_DEVICES' not in environ
  assert placement.chosen().line(environ) == (
      'GPUs 0,1 (all this host shows it; nvidia-smi -L: 2)')


def test_a_host_name_on_loopback_is_one_line_where_hosts_must_connect():
  """JAX's CPU collectives listen where the host's name resolves: on
  Debian's 127.0.1.1 two hosts never connect (measured: a timeout, then a
  traceback). Processes all on this host may use loopback."""
  two_hosts = cluster_lib.from_environment(SLURM)
  assert placement.unreachable_host_name(
      two_hosts, 'gpu08', lambda name: '127.0.1.1') == (
          "this host's name 'gpu08' resolves to 127.0.1.1, a loopback "
          "address: JAX's CPU collectives (gloo) would listen there and the "
          'other hosts of Slurm (job 4101) could not connect; map \'gpu08\' '
          'to an address they reach in /etc/hosts (Debian maps a host\'s own '
          'name to 127.0.1.1)')
  assert placement.unreachable_host_name(
      two_hosts, 'gpu08', lambda name: '10.0.0.8') is None
  one_host = cluster_lib.from_environment(dict(
      SLURM, SLURM_STEP_TASKS_PER_NODE='4', SLURM_NODEID='0'))
  assert placement.unreachable_host_name(
      one_host, 'gpu07', lambda name: '127.0.0.1') is None


def test_processes_named_by_hand_on_loopback_stay_on_one_host():
  """JAX_COORDINATOR_ADDRESS on 127.0.0.1: every process is on this host,
  whatever this host's name resolves to; one elsewhere is checked."""
  here = cluster_lib.from_environment({
      'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'JAX_NUM_PROCESSES': '2',
      'JAX_PROCESS_ID': '1'})
  loopback = lambda name: '127.0.0.1' if name != 'coordinator' else '10.0.0.1'
  assert placement.unreachable_host_name(here, 'vm', loopback) is None
  there = cluster_lib.from_environment({
      'JAX_COORDINATOR_ADDRESS': 'coordinator:1234', 'JAX_NUM_PROCESSES': '2',
      'JAX_PROCESS_ID': '1'})
  assert placement.unreachable_host_name(there, 'vm', loopback).startswith(
      "this host's name 'vm' resolves to 127.0.0.1, a loopback address")


@pytest.mark.parametrize('visible, driver, kept, why', [
    # Horovod's and sites' wrapper: CUDA_VISIBLE_DEVICES=$LOCAL_RANK, one
    # GPU each for the host's two ranks (too few to share: its own).
    ('1', 0, ('1',), "its own, by CUDA_VISIBLE_DEVICES per process under "
     "Open MPI 5 (1 for each of the host's 2 processes)"),
    # A disjoint pair each of the host's four: its own, as nvidia-smi counts.
    ('2,3', 4, ('2', '3'), "its own, by CUDA_VISIBLE_DEVICES per process "
     "under Open MPI 5 (2 for each of the host's 2 processes)"),
    # Every rank shown all four: an equal share by local rank.
    ('0,1,2,3', 4, ('2', '3'), 'its share of 4, by local rank 1 of 2: Open '
     'MPI 5 binds no GPUs'),
])
def test_mpirun_ranks_given_their_own_gpus_keep_them(visible, driver, kept,
                                                      why):
  second = cluster_lib.from_environment({
      'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1',
      'OMPI_COMM_WORLD_LOCAL_RANK': '1', 'OMPI_COMM_WORLD_LOCAL_SIZE': '2'})
  found = placement.bind(second, {'CUDA_VISIBLE_DEVICES': visible}, driver)
  assert (found.entries, found.why) == (kept, why)


def test_a_process_left_too_few_cores_is_one_line_with_its_engines_fix():
  mpi = cluster_lib.from_environment({
      'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '0',
      'OMPI_COMM_WORLD_LOCAL_RANK': '0', 'OMPI_COMM_WORLD_LOCAL_SIZE': '1'})
  assert placement.starved_cpus(mpi, 1, 64) == (
      "this process may run on 1 of its host's 64 cores (its CPU affinity), "
      'fewer than its share of 64 for 1 process(es) a host: the input '
      'pipeline gets too few and the accelerators wait; start mpirun with '
      '--bind-to none, or give each process its cores (--map-by '
      'ppr:1:node:PE=64)')
  assert placement.starved_cpus(mpi, 64, 64) is None
  slurm = cluster_lib.from_environment(SLURM)  # Two tasks a node.
  assert placement.starved_cpus(slurm, 32, 64) is None
  assert placement.starved_cpus(slurm, 8, 64).endswith(
      'give each task its cores (srun --cpus-per-task=32)')
  assert placement.starved_cpus(None, 2, 2) is None


def test_a_join_short_of_the_engines_count_is_one_line():
  found = cluster_lib.from_environment({
      'OMPI_COMM_WORLD_SIZE': '8', 'OMPI_COMM_WORLD_RANK': '3',
      'OMPI_COMM_WORLD_LOCAL_RANK': '3', 'OMPI_COMM_WORLD_LOCAL_SIZE': '8'})
  assert cluster_lib.joined_problem(found, 8) is None
  assert cluster_lib.joined_problem(found, 1).startswith(
      'Open MPI 5 started 8 processes, but 1 joined the run: mpi4py asked an '
      'MPI library other than the mpirun that started them')
  assert cluster_lib.joined_problem(None, 1) is None
