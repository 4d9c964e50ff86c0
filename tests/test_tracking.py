"""Experiment tracking (--config.tracking=mlflow,wandb), with real trackers.

A real MLflow server, started here on loopback, and Weights & Biases in its
offline mode (its files in the workdir) track a tiny run and its resumed
extension on the backend of this environment (TensorFlow here; the JAX tier
runs this module on JAX): the parameters, eval accuracy at each evaluation,
the artifacts, and one tracked run across the resume. A tracker that cannot
reach its server is one line and the run trains on.
"""

import glob
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import free_port, jax_args, run_train, tiny_args

pytest.importorskip('mlflow', reason='requirements-tracking.txt')
pytest.importorskip('wandb', reason='requirements-tracking.txt')

ON_JAX = os.environ.get('KERAS_BACKEND') == 'jax'


@pytest.fixture(scope='module', name='mlflow_server')
def fixture_mlflow_server(tmp_path_factory):
  """`mlflow server` on a loopback port, its store and artifacts in a
  temporary folder; its URI."""
  root = tmp_path_factory.mktemp('mlflow')
  port = free_port()
  server = subprocess.Popen(
      [sys.executable, '-m', 'mlflow', 'server', '--host', '127.0.0.1',
       '--port', str(port), '--workers', '1',
       '--backend-store-uri', f'sqlite:///{root}/mlflow.db',
       '--artifacts-destination', str(root / 'artifacts')],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  uri = f'http://127.0.0.1:{port}'
  deadline = time.time() + 180
  while True:
    try:
      with urllib.request.urlopen(f'{uri}/health', timeout=5) as answer:
        if answer.status == 200:
          break
    except OSError:
      pass
    assert server.poll() is None, server.stderr.read()[-3000:]
    assert time.time() < deadline, 'the MLflow server did not start'
    time.sleep(1)
  yield uri
  server.terminate()
  server.wait(timeout=30)


def _wandb_records(path):
  """The records of a W&B run file (run-ID.wandb): LevelDB's log format
  (32 KiB blocks of checksummed fragments) after a 7-byte ':W&B' header,
  each record a wandb_internal_pb2.Record; W&B's own reader left its
  Python package with its Go core."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    data = f.read()
  assert data[:4] == b':W&B', data[:7]
  position, block, record = 7, 32768, b''
  while position + 7 <= len(data):
    left = block - position % block
    _, length, kind = struct.unpack('<IHB', data[position:position + 7])
    if left < 7 or (length, kind) == (0, 0):  # A block's padding.
      position += left
      continue
    fragment = data[position + 7:position + 7 + length]
    position += 7 + length
    record = fragment if kind in (1, 2) else record + fragment  # FULL, FIRST.
    if kind in (1, 4):  # FULL, LAST.
      parsed = wandb_internal_pb2.Record()
      parsed.ParseFromString(record)
      yield parsed


def _wandb_run(offline):
  """({key: JSON value} of the run's config, [{key: value}] of its
  history rows) from an offline run folder."""
  (path,) = glob.glob(os.path.join(offline, 'run-*.wandb'))
  config, history = {}, []
  for record in _wandb_records(path):
    kind = record.WhichOneof('record_type')
    if kind == 'run':
      config.update({u.key: u.value_json for u in record.run.config.update})
    elif kind == 'history':
      history.append({item.key or '/'.join(item.nested_key):
                      json.loads(item.value_json)
                      for item in record.history.item})
  return config, history


def _args(workdir, tfds_dir, *extra):
  """A tiny run that evaluates every epoch, on this environment's backend."""
  if ON_JAX:  # 10 steps an epoch.
    return jax_args(workdir, tfds_dir, '--config.eval_every_epochs=0.5',
                    *extra)
  return tiny_args(workdir, tfds_dir, '--config.eval_every_epochs=1', *extra)


def _env(uri):
  return {'MLFLOW_TRACKING_URI': uri, 'WANDB_MODE': 'offline',
          'WANDB_SILENT': 'true'}


@pytest.mark.slow
def test_mlflow_and_wandb_track_a_run_and_its_resume(mlflow_server, tfds_dir,
                                                     tmp_path):
  import mlflow  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  first = run_train(*_args(workdir, tfds_dir, '--config.tracking=mlflow,wandb',
                           '--config.export=true'), env=_env(mlflow_server))
  assert first.returncode == 0, first.stderr[-3000:]
  ids = json.loads((workdir / 'tracking.json').read_text())
  assert set(ids) == {'mlflow', 'wandb'}
  metrics = json.loads((workdir / 'metrics.json').read_text())
  total = metrics['total_steps']
  # Executions of 4 steps: the one that crosses the first interval (8 of
  # 16 on TensorFlow, 5 of 10 on JAX) evaluates at its end, step 8.
  evaluations = [8, total]

  client = mlflow.MlflowClient(tracking_uri=mlflow_server)
  run = client.get_run(ids['mlflow'])
  assert run.info.status == 'FINISHED'
  assert run.data.params['config.model'] == 'efficientnet_tiny'
  assert run.data.params['plan.backend'] == ('jax' if ON_JAX else
                                             'tensorflow')
  accuracy = client.get_metric_history(ids['mlflow'], 'eval/accuracy')
  assert [m.step for m in accuracy] == evaluations
  assert accuracy[-1].value == pytest.approx(metrics['eval_accuracy'])
  assert [m.step for m in client.get_metric_history(
      ids['mlflow'], 'train/grad_norm')][-1] == total
  artifacts = {a.path for a in client.list_artifacts(ids['mlflow'])}
  assert {'metrics.json', 'run.json', 'export', 'run.log',
          'tensorboard'} <= artifacts
  exported = {a.path for a in client.list_artifacts(ids['mlflow'], 'export')}
  assert 'export/saved_model.pb' in exported
  # The log that ends with the Done line, and the eval curve's events.
  log = client.download_artifacts(ids['mlflow'], 'run.log',
                                  str(workdir / 'downloaded'))
  assert 'Done: eval_accuracy' in open(log).read()
  assert any(a.path.startswith('tensorboard/eval/events.out.tfevents')
             for a in client.list_artifacts(ids['mlflow'], 'tensorboard/eval'))

  (offline,) = glob.glob(str(workdir / 'wandb' /
                             f'offline-run-*-{ids["wandb"]}'))
  config, history = _wandb_run(offline)
  assert json.loads(config['config.model']) == 'efficientnet_tiny'
  evaluated = [(row['_step'], row['eval/accuracy']) for row in history
               if 'eval/accuracy' in row]
  assert [step for step, _ in evaluated] == evaluations
  assert evaluated[-1][1] == pytest.approx(metrics['eval_accuracy'])
  files = os.path.join(offline, 'files')
  for name in ('metrics.json', 'run.json', 'export/saved_model.pb',
               'run.log'):
    assert os.path.exists(os.path.join(files, name)), name
  assert glob.glob(os.path.join(files, 'tensorboard', 'eval',
                                'events.out.tfevents.*'))

  # Extended by an epoch: the same MLflow run and W&B run go on.
  resumed = run_train(*_args(workdir, tfds_dir,
                             '--config.tracking=mlflow,wandb',
                             '--config.export=true', '--config.epochs=' +
                             ('2' if ON_JAX else '3'),
                             '--accept_changes=epochs'),
                      env=_env(mlflow_server))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'Tracking: mlflow run {ids["mlflow"]} (resumed)' in resumed.stderr
  assert json.loads((workdir / 'tracking.json').read_text()) == ids
  longer = json.loads((workdir / 'metrics.json').read_text())['total_steps']
  steps = [m.step for m in client.get_metric_history(ids['mlflow'],
                                                     'eval/accuracy')]
  assert steps[:2] == evaluations and steps[-1] == longer > total
  run = client.get_run(ids['mlflow'])
  assert run.data.tags['accepted.epochs'].endswith(
      '-> 3' if not ON_JAX else '-> 2')
  assert len(glob.glob(str(workdir / 'wandb' /
                           f'offline-run-*-{ids["wandb"]}'))) == 2


@pytest.mark.slow
def test_an_unreachable_tracker_is_one_line_and_the_run_trains_on(tfds_dir,
                                                                   tmp_path):
  workdir = tmp_path / 'run'
  port = free_port()  # Nothing listens there.
  result = run_train(*_args(workdir, tfds_dir, '--config.tracking=mlflow'),
                     env={'MLFLOW_TRACKING_URI': f'http://127.0.0.1:{port}'})
  assert result.returncode == 0, result.stderr[-3000:]
  warned = [l for l in result.stderr.splitlines() if 'Tracking:' in l]
  assert len(warned) == 1 and 'mlflow did not start, and the run goes on ' \
      'without it: ' in warned[0], warned
  assert 'Traceback' not in result.stderr
  assert json.loads((workdir / 'metrics.json').read_text())['train_steps'] > 0
  assert not (workdir / 'tracking.json').exists()
