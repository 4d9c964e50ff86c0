"""cloud-tpu-client: the environment it installs into, and --tpu_runtime_version.

No TPU can exist on the machines these tests run on, so the two HTTP servers
a TPU Node answers with are stood in for by small local servers
(http.server on loopback, in a thread): the Cloud TPU API (a discovery
document and `nodes.get`) and a TPU worker's version switcher on port 8475.
Everything in front of them is real: cloud-tpu-client, googleapiclient,
google-auth (anonymous credentials), urllib, our flags and error handling.
A fake stands in only for what a TPU would answer; the run stops where a real
TPU would next be reached (its gRPC worker on port 8470).
"""

import http.server
import importlib.metadata
import importlib.util
import json
import os
import random
import subprocess
import sys
import threading

import pytest
import tensorflow as tf

from conftest import run_train
from pipeline.backends.tensorflow import devices
from pipeline.backends.tensorflow import tpu_runtime
from pipeline.errors import UserError

VERSION = tf.__version__
SWITCH = ('POST', f'/requestversion/{VERSION}?restartType=ifNeeded')
needs_client = pytest.mark.skipif(
    importlib.util.find_spec('cloud_tpu_client') is None,
    reason='cloud-tpu-client is not installed (requirements-tpu-client.txt)')


class FakeTpuServer:
  """A loopback HTTP server answering like the Cloud TPU API or a TPU worker.

  `routes` maps (method, path) to (status, JSON body); every request is
  recorded as (method, path with query).
  """

  def __init__(self, host, port, routes):
    self.routes = routes
    self.requests = []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def _answer(self):
        server.requests.append((self.command, self.path))
        path = self.path.split('?')[0]
        status, body = server.routes.get((self.command, path), (404, {}))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      do_GET = do_POST = _answer

      def log_message(self, *args):
        del args

    self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)
    self.url = f'http://{host}:{self.httpd.server_address[1]}'
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def worker_ip():
  """A loopback address of its own: the version switcher's port is fixed."""
  return f'127.{random.randint(1, 254)}.{random.randint(1, 254)}.' \
         f'{random.randint(1, 254)}'


@pytest.fixture
def switcher(worker_ip):
  """A TPU worker's version switcher (cloud-tpu-client posts to HOST:8475)."""
  server = FakeTpuServer(worker_ip, 8475, {})
  server.routes[('POST', f'/requestversion/{VERSION}')] = (200, {})
  yield server
  server.close()


@needs_client
def test_client_installs_beside_tensorflow_and_storage():
  """requirements-tpu-client.txt (--no-deps) left TensorFlow (the pinned
  version: 2.21, or 2.20 in the TPU build's environment) and GCS 3.x
  working."""
  code = ('import tensorflow as tf, google.cloud.storage as gcs, '
          'cloud_tpu_client, googleapiclient.discovery, google.protobuf as pb; '
          'print(tf.__version__, gcs.__version__, pb.__version__)')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  tf_version, storage_version, _ = result.stdout.split()
  pinned = '2.20.0' if _installed('tensorflow-tpu') else '2.21.0'
  assert tf_version == pinned and storage_version.startswith('3.')
  # pip check: only cloud-tpu-client's own stale pins, which --no-deps skips.
  check = subprocess.run([sys.executable, '-m', 'pip', 'check'],
                         capture_output=True, text=True, timeout=120,
                         check=False)
  problems = [l for l in check.stdout.splitlines() if l.strip()]
  assert problems and all(l.startswith('cloud-tpu-client ') for l in problems), (
      check.stdout)


def _installed(distribution):
  try:
    importlib.metadata.version(distribution)
    return True
  except importlib.metadata.PackageNotFoundError:
    return False


def test_runtime_version_choices():
  assert tpu_runtime.runtime_version('') == ''
  assert tpu_runtime.runtime_version('match', '2.20.0') == '2.20.0'
  assert tpu_runtime.runtime_version('match', '2.20.0+tpu') == '2.20.0'
  assert tpu_runtime.runtime_version('2.12.0') == '2.12.0'


def test_missing_client_is_one_line_with_the_install_command(monkeypatch):
  monkeypatch.setitem(sys.modules, 'cloud_tpu_client', None)  # Import fails.
  with pytest.raises(UserError, match='pip install --no-deps -r '
                     'requirements-tpu-client.txt'):
    tpu_runtime.configure('grpc://127.0.0.1:8470', VERSION)


@pytest.mark.parametrize('tpu, problem', [
    ('local', 'applies to TPU Nodes'), ('', 'needs a TPU Node')])
def test_runtime_version_needs_a_tpu_node(tpu, problem):
  with pytest.raises(UserError, match=problem):
    devices.resolve(tpu=tpu, tpu_runtime_version='match')


@needs_client
def test_grpc_worker_is_asked_to_switch_if_needed(switcher, worker_ip):
  tpu_runtime.configure(f'grpc://{worker_ip}:8470', VERSION)
  assert switcher.requests == [SWITCH]


@needs_client
def test_a_version_the_tpu_lacks_is_one_line(switcher, worker_ip):
  with pytest.raises(UserError, match="'1.0.0' failed: Tensorflow version "
                     '1.0.0 is not available on Cloud TPU'):
    tpu_runtime.configure(f'grpc://{worker_ip}:8470', '1.0.0')


@needs_client
def test_named_tpu_goes_through_the_cloud_tpu_api(switcher, worker_ip):
  """Name -> Cloud TPU API nodes.get -> the worker's switcher -> HEALTHY."""
  import googleapiclient  # pylint: disable=g-import-not-at-top
  from google.auth import credentials  # pylint: disable=g-import-not-at-top
  api = FakeTpuServer('127.0.0.1', 0, {})
  try:
    document_path = os.path.join(os.path.dirname(googleapiclient.__file__),
                                 'discovery_cache', 'documents', 'tpu.v1.json')
    with open(document_path) as f:
      document = json.load(f)  # The real v1 document, pointed at the fake.
    document['rootUrl'] = document['baseUrl'] = api.url + '/'
    node = 'v1/projects/proj/locations/us-central1-b/nodes/my-tpu'
    api.routes[('GET', '/discovery')] = (200, document)
    api.routes[('GET', '/' + node)] = (200, {
        'state': 'READY', 'health': 'HEALTHY',
        'networkEndpoints': [{'ipAddress': worker_ip, 'port': 8470}]})
    tpu_runtime.configure('my-tpu', VERSION, zone='us-central1-b',
                          project='proj',
                          credentials=credentials.AnonymousCredentials(),
                          discovery_url=api.url + '/discovery')
    get_node = ('GET', f'/{node}?alt=json')
    # The endpoints lookup, then wait_for_healthy's after the switch.
    assert api.requests == [('GET', '/discovery'), get_node, get_node]
    assert switcher.requests == [SWITCH]
  finally:
    api.close()


@needs_client
def test_cli_matches_the_runtime_then_stops_at_the_tpu(switcher, worker_ip,
                                                       tmp_path):
  """--tpu_runtime_version=match posts tf.__version__, then the gRPC worker
  (port 8470, where a real TPU would answer) is unreachable: one line."""
  tpu = f'grpc://{worker_ip}:8470'
  result = run_train(f'--tpu={tpu}', '--tpu_runtime_version=match',
                     f'--workdir={tmp_path}', '--dry_run', timeout=300)
  assert switcher.requests == [SWITCH]
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and f"TPU '{tpu}' could not be reached" in errors[0]

