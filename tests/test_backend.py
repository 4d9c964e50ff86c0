"""The backend choice: explicit, or auto on what is installed and attached.

`choose` is given what is installed and attached (a TPU chip cannot exist
here); each case is the rule a user on that machine meets.
"""

import json

import pytest

from conftest import run_module
from pipeline import backends
from pipeline.rules.speed import measured
from pipeline.errors import UserError

T4 = 'Tesla T4'
# What launch.benchmark --backends=tensorflow,jax measured, as across_backends
# returns it (figures of an imagined T4).
COMPARISON = {'backends': [
    [name, {measured.RATE: rate, 'policy': 'mixed_float16',
            'model': 'efficientnet_b0', 'image_size': 224,
            'global_batch_size': 128}]
    for name, rate in (('tensorflow', 900.0), ('jax', 1150.0))]}


def _choose(*args, **kwargs):
  """backends.choose on a machine whose Python the JAX route runs on (the
  fast suite's is 3.11, where the JAX route is refused: tested apart)."""
  kwargs.setdefault('python', (3, 12))
  return backends.choose(*args, **kwargs)


@pytest.mark.parametrize('requested, tpu, installed, attached, expected', [
    # Colab's TPU runtime and TPU7x: no tensorflow-tpu, JAX installed.
    ('auto', 'local', dict(tensorflow_tpu=False, jax=True), False, 'jax'),
    ('auto', '', dict(tensorflow_tpu=False, jax=True), True, 'jax'),
    # A TPU VM on a TF 2.20 image keeps TensorFlow's TPU build.
    ('auto', 'local', dict(tensorflow_tpu=True, jax=True), False,
     'tensorflow'),
    # TPU Nodes are TensorFlow's, JAX installed or not.
    ('auto', 'my-tpu', dict(tensorflow_tpu=False, jax=True), False,
     'tensorflow'),
    ('auto', 'grpc://10.0.0.2:8470', dict(tensorflow_tpu=True, jax=False),
     False, 'tensorflow'),
    # No TPU: TensorFlow, even with JAX installed.
    ('auto', '', dict(tensorflow_tpu=False, jax=True), False, 'tensorflow'),
    ('jax', '', dict(tensorflow_tpu=False, jax=True), False, 'jax'),
    ('tensorflow', 'local', dict(tensorflow_tpu=False, jax=True), False,
     'tensorflow'),
])
def test_each_machine_gets_its_backend_and_a_reason(requested, tpu, installed,
                                                     attached, expected):
  name, reason = _choose(requested, tpu, attached=attached, gpus=[],
                                 **installed)
  assert name == expected
  assert reason and ('--backend' in reason if requested != 'auto'
                     else '--backend' not in reason)


def test_auto_on_a_tpu_says_why_it_picked_jax():
  _, reason = _choose('auto', 'local', tensorflow_tpu=False, jax=True,
                             attached=False)
  assert reason == ('--tpu=local and no TensorFlow TPU build is installed '
                    '(tensorflow-tpu); Keras runs on JAX')


@pytest.mark.parametrize('requested, tpu, installed, message', [
    ('torch', '', dict(jax=True),
     '--backend=torch is not a backend; accepted: auto, tensorflow, jax'),
    ('jax', '', dict(jax=False), '--backend=jax needs JAX, which is not '
     'installed; pip install -r requirements-jax.txt'),
    ('jax', 'my-tpu', dict(jax=True), '--backend=jax cannot drive a TPU Node '
     '(--tpu=my-tpu)'),
    ('auto', 'local', dict(jax=False), '--tpu=local, but neither '
     'tensorflow-tpu nor JAX is installed'),
])
def test_a_backend_that_cannot_run_is_one_line(requested, tpu, installed,
                                               message):
  with pytest.raises(UserError) as raised:
    _choose(requested, tpu, tensorflow_tpu=False, attached=False,
                   **installed)
  assert str(raised.value).startswith(message)
  assert '\n' not in str(raised.value)


@pytest.mark.parametrize('trained_on, backend_now, trains, refused', [
    ('jax', 'tensorflow', True, True),
    ('tensorflow', 'jax', True, True),
    (None, 'jax', True, True),  # A run.json from before backends: TensorFlow.
    ('jax', 'jax', True, False),
    ('jax', 'tensorflow', False, False),  # launch.evaluate reads either.
])
def test_a_run_resumes_on_the_backend_it_trained_on(trained_on, backend_now,
                                                    trains, refused,
                                                    tmp_path):
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.run import left_open  # pylint: disable=g-import-not-at-top
  from pipeline.run import run_workdir  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  resolved = {'backend': trained_on} if trained_on else {}
  workdirs.write_json(str(tmp_path / 'run.json'), {
      'config': {key: config[key] for key in run_workdir.RUN_IDENTITY},
      'resolved': resolved})
  workdir = workdirs.Workdir(str(tmp_path), str(tmp_path / 'staging'))
  check = lambda: run_workdir.check_same_run(
      workdir, run_workdir.recipe(config, 'float32', left_open.Resolved(
          32, 32, 'translate', 0)),
      backends.load(backend_now) if trains else None)
  if not refused:
    assert check()['resolved'] == resolved
    return
  with pytest.raises(UserError) as raised:
    check()
  on = trained_on or 'tensorflow'
  assert str(raised.value) == (
      f"workdir '{tmp_path}' holds a run trained on {on}, which resumes "
      f'there only: --backend={on}, or another --workdir')


@pytest.mark.parametrize('jax, saved, environ, expected, says', [
    # No measurement saved: TensorFlow, and how to measure both.
    (True, None, {}, 'tensorflow', 'Tesla T4: TensorFlow, whose path here '
     'was measured on GPUs; no measurement of both backends is saved'),
    (False, None, {}, 'tensorflow', 'with JAX installed: '
     'requirements-gpu.txt)'),
    # The user's measurement on this GPU and software decides.
    (True, {'backend': 'jax', 'reason': 'your measurement'}, {}, 'jax',
     'your measurement'),
    (True, {'backend': 'tensorflow', 'reason': 'your measurement'}, {},
     'tensorflow', 'your measurement'),
    # Several TensorFlow workers stay TensorFlow's.
    (True, {'backend': 'jax', 'reason': 'r'}, {'TF_CONFIG': '{}'},
     'tensorflow', 'TF_CONFIG joins TensorFlow workers'),
])
def test_auto_on_gpus_takes_the_measured_backend(jax, saved, environ,
                                                 expected, says, tmp_path,
                                                 monkeypatch):
  """No GPU here: the GPU models are a stand-in for what the driver lists."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  for name, value in environ.items():
    monkeypatch.setenv(name, value)
  name, reason = _choose('auto', '', tensorflow_tpu=False, jax=jax,
                                 attached=False, gpus=[T4], saved=saved)
  assert name == expected and says in reason


def test_a_saved_comparison_decides_the_backend_and_its_policy(tmp_path,
                                                              monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  record, path = measured.save(COMPARISON, T4, backends.both_software())
  assert record['backend'] == 'jax' and path.startswith(str(tmp_path))
  name, reason = _choose('auto', '', tensorflow_tpu=False, jax=True,
                                 attached=False, gpus=[T4])
  assert name == 'jax'
  assert reason == ('your measurement saved for this GPU and software: jax '
                    '1,150, tensorflow 900 img/s (efficientnet_b0 224 px, '
                    'batch 128, mixed_float16)')
  assert backends.measured_policy(T4, backends.load('jax')) == (
      'mixed_float16', reason)
  assert backends.measured_policy(T4, backends.load('tensorflow')) is None
  # Another GPU model: the rule.
  assert _choose('auto', '', tensorflow_tpu=False, jax=True,
                         attached=False, gpus=['NVIDIA A100'])[0] == (
                             'tensorflow')


def test_a_damaged_saved_comparison_falls_back_to_the_rule(tmp_path,
                                                          monkeypatch,
                                                          caplog):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  _, path = measured.save(COMPARISON, T4, backends.both_software())
  with open(path, 'w', encoding='utf-8') as f:
    json.dump({'backend': 'jax'}, f)  # A record missing its figures.
  assert _choose('auto', '', tensorflow_tpu=False, jax=True,
                         attached=False, gpus=[T4])[0] == 'tensorflow'
  assert f'saved backend choice {path} is unreadable' in caplog.text


@pytest.mark.parametrize('backends_flag, message', [
    ('tensorflow,jax', '--save_policy keeps a backend for a GPU model; this '
     'machine has no NVIDIA GPU'),
    ('jax', '--save_policy with --backends keeps the faster of both: '
     '--backends=tensorflow,jax'),
])
def test_saving_a_comparison_without_a_gpu_is_one_line(backends_flag,
                                                       message):
  result = run_module('launch.benchmark', f'--backends={backends_flag}',
                      '--save_policy', timeout=120)
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == f'error: {message}'


def test_a_backend_that_fails_in_a_comparison_is_its_rows_one_line():
  """A real child process that fails (JAX, not installed in this
  environment; in the JAX environment a flag only TensorFlow takes): its
  row says why, and the other backend's figures stand beside it."""
  from pipeline.reports import benchmark  # pylint: disable=g-import-not-at-top
  from pipeline.reports.benchmark import tables as benchmark_tables  # pylint: disable=g-import-not-at-top
  result = benchmark.across_backends(['jax'], ['--collective=ring'])
  [[name, failed]] = result['backends']
  assert name == 'jax' and failed['failed'].startswith('error: ')
  assert benchmark.failed_backends(result) == ['jax']
  tensorflow = {
      'model': 'efficientnet_b0', 'image_size': 32, 'global_batch_size': 32,
      'policy': 'float32', 'device_kind': 'CPU', 'detail': 'host CPU',
      'strategy': 'DefaultStrategy', 'num_replicas': 1,
      'train_synthetic_images_per_sec': 120.0,
      'train_real_images_per_sec': 100.0, 'compile_s': 30.0,
      'step_cost_reason': 'XLA could not analyse the step alone here (x)',
      'overlap_wall_vs_sum': 0.55}
  table = benchmark_tables.backends_table(
      {'backends': [['tensorflow', tensorflow], [name, failed]]})
  assert table.splitlines()[2:] == [
      'tensorflow   DefaultStrategy x1              120.0       100.0'
      '       30.0',
      f'jax          failed: {failed["failed"]}',
      'tensorflow: FLOPs per image: none (XLA could not analyse the step '
      'alone here (x))',
      'tensorflow: input as slow as the model: wall time 0.55 x (input + '
      'model); 0.5 overlaps them fully, 1.0 not at all']


def test_the_jax_route_is_refused_on_a_python_it_was_not_tested_on():
  """JAX 0.10, the last release for Python 3.11, is a route no test runs:
  asked for or chosen there, it is one line."""
  for requested, tpu in (('jax', ''), ('auto', 'local')):
    with pytest.raises(UserError) as raised:
      backends.choose(requested, tpu, tensorflow_tpu=False, jax=True,
                      attached=False, gpus=[], python=(3, 11))
    assert str(raised.value) == (
        'the JAX route runs on Python 3.12 or later (jax 0.11.2, the version '
        'tested); this is Python 3.11: make the environment with python3.12 '
        '-m venv and pip install -r requirements-jax.txt, or pass '
        '--backend=tensorflow')
  assert backends.choose('auto', '', tensorflow_tpu=False, jax=True,
                         attached=False, gpus=[], python=(3, 11))[0] == (
                             'tensorflow')


OPEN_MPI_5 = {'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_RANK': '1',
              'OMPI_COMM_WORLD_LOCAL_RANK': '1',
              'OMPI_COMM_WORLD_LOCAL_SIZE': '2'}


@pytest.mark.parametrize('gpus', [[], [T4]])
def test_auto_under_mpirun_picks_the_backend_that_can_join(gpus):
  """mpirun names no host list, which TensorFlow's workers need: `auto`
  takes JAX, which joins through it, on GPUs and CPUs alike; TF_CONFIG set
  by hand keeps TensorFlow; without JAX, TensorFlow (which then says what
  it lacks)."""
  name, reason = _choose('auto', '', tensorflow_tpu=False, jax=True,
                         attached=False, gpus=gpus, environ=OPEN_MPI_5)
  assert name == 'jax'
  assert reason == ('Open MPI 5 started 2 processes without naming every '
                    "host, which TensorFlow's workers need; JAX joins "
                    'through it')
  assert _choose('auto', '', tensorflow_tpu=False, jax=True, attached=False,
                 gpus=gpus, environ=dict(OPEN_MPI_5, TF_CONFIG='{}'),
                 saved={})[0] == 'tensorflow'
  assert _choose('auto', '', tensorflow_tpu=False, jax=False,
                 attached=False, gpus=gpus,
                 environ=OPEN_MPI_5)[0] == 'tensorflow'
