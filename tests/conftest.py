"""Shared test setup: two logical CPU devices, a prepared digits data set.

The CPU is split before anything initialises TensorFlow's devices, so every
test in this process can build a real MirroredStrategy over 2 replicas.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('NO_GCE_CHECK', 'true')

import pytest  # pylint: disable=g-import-not-at-top

try:
  import tensorflow as tf
except ImportError:  # The probe's environment: JAX alone (test_probe.py).
  tf = None
else:
  from pipeline.backends.tensorflow import devices  # pylint: disable=g-import-not-at-top
  devices.split_cpu(2)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='session')
def tfds_dir(tmp_path_factory):
  """A tfds data_dir with sklearn_digits prepared once per session."""
  from pipeline.data import sources  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tfds'))
  sources.load_source(ml_collections.ConfigDict(dict(
      dataset='sklearn_digits', data_dir=path, train_split='train',
      eval_split='')))
  return path


def run_module(module, *args, env=None, timeout=600):
  """Runs `python -m MODULE ARGS` in a fresh process, output captured."""
  full_env = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, '-m', module, *args],
                        cwd=REPO, env=full_env, capture_output=True, text=True,
                        timeout=timeout, check=False)


def run_train(*args, env=None, timeout=600):
  """Runs `python -m launch.train ARGS` in a fresh process."""
  return run_module('launch.train', *args, env=env, timeout=timeout)


_PORTS = random.Random()  # Seeded by the OS: each test process its own.


def free_port():
  """A TCP port nothing listens on now, below the range the kernel hands
  out to connecting sockets (ip_local_port_range): a client retrying while
  a server is down could otherwise be given that very port for its own end
  (on loopback a connect to an unused port can even connect to itself) and
  hold it, so the server, restarted, could not bind it."""
  import socket  # pylint: disable=g-import-not-at-top
  try:
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      lowest = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    lowest = 32768  # Linux's default.
  for port in _PORTS.sample(range(10000, lowest), 200):
    with socket.socket() as s:
      try:
        s.bind(('', port))
        return port
      except OSError:
        continue
  raise RuntimeError(f'no free port in 10000-{lowest}')


def tf_config(ports, index):
  """TF_CONFIG for worker `index` of workers on loopback at `ports`."""
  import json  # pylint: disable=g-import-not-at-top
  return json.dumps({'cluster': {'worker': [f'127.0.0.1:{p}' for p in ports]},
                     'task': {'type': 'worker', 'index': index}})


# Runs whose export no test reads skip it (4 s a tiny TensorFlow run, 10 s
# a JAX run's: its export is a child process on TensorFlow); a test of the
# export passes --config.export=true after these.
NO_EXPORT = ('--config.export=false',)


def tiny_args(workdir, tfds_dir, *extra):
  """Flags for the smallest real run: B0's code at a fraction of its size
  (models.efficientnet_tiny), 32 px, on a slice of digits."""
  return (f'--workdir={workdir}', f'--config.data_dir={tfds_dir}',
          '--config.model=efficientnet_tiny',
          '--config.train_split=train[:256]', '--config.global_batch_size=32',
          '--config.epochs=2', '--config.steps_per_execution=4',
          '--config.log_every_steps=4', '--config.eval_every_epochs=0',
          *NO_EXPORT, *extra)


def jax_args(workdir, tfds_dir, *extra, devices=2):
  """Ten steps of 32 images over 2 devices, 4 per execution (a short last
  one), a checkpoint every 4, a moving average, the tiny network. float32 unless a test asks
  for another policy (the last --policy wins): `auto` follows a sweep a
  user saved on this machine, and the tolerances across backends are
  float32's."""
  return ('--backend=jax', f'--num_cpu_devices={devices}', '--policy=float32',
          f'--workdir={workdir}', '--config.model=efficientnet_tiny',
          f'--config.data_dir={tfds_dir}', '--config.epochs=1',
          '--config.examples_per_epoch=320', '--config.global_batch_size=32',
          '--config.steps_per_execution=4', '--config.log_every_steps=4',
          '--config.checkpoint_every_steps=4', '--config.ema_decay=0.9',
          *NO_EXPORT, *extra)


def network_arithmetic(name, image_size, num_classes=1000):
  """(parameters, depthwise convolutions, multiply-adds, activations) an
  image of the network a run or the probe builds, counted from its layers:
  each convolution's kernel applied at every output position, the head's
  once; the elements each layer reads and writes, summed."""
  import math  # pylint: disable=g-import-not-at-top
  if tf is None:  # Keras' backend is JAX where TensorFlow is absent.
    os.environ.setdefault('KERAS_BACKEND', 'jax')
  import keras  # pylint: disable=g-import-not-at-top
  from pipeline.recipe import models  # pylint: disable=g-import-not-at-top
  model = models.build_model(name, num_classes, image_size)

  def leaves(layer):
    inner = getattr(layer, 'layers', None)
    return [leaf for sub in inner for leaf in leaves(sub)] if inner else [
        layer]

  def elements(tensors):
    return sum(math.prod(t.shape[1:]) for t in keras.tree.flatten(tensors))

  depthwise = macs = activations = 0
  for layer in leaves(model):
    if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)):
      height, width = layer.output.shape[1:3]
      macs += height * width * math.prod(layer.kernel.shape)
      depthwise += isinstance(layer, keras.layers.DepthwiseConv2D)
    elif isinstance(layer, keras.layers.Dense):
      macs += math.prod(layer.kernel.shape)
    if not isinstance(layer, keras.layers.InputLayer):
      activations += elements(layer.input) + elements(layer.output)
  return model.count_params(), depthwise, macs, activations


assert tf is None or tf.config.list_logical_devices('CPU'), (
    'TensorFlow sees no CPU')


def make_tree(root, per_class=24, scale=2):
  """A folder of class folders (pipeline/data/sources/image_folder/) from the
  bundled digits: root/<digit name>/ of digits `scale` times their 8 px
  (16x16 unless asked), PNG, every third JPEG, every fourth in a
  sub-folder; one damaged PNG and one .DS_Store. Returns the damaged
  file's path."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  spoken = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven',
            'eight', 'nine')
  for digit, name in enumerate(spoken):
    images = digits.images[digits.target == digit][:per_class]
    for i, image in enumerate(images):
      pixels = np.kron(np.round(image * 255 / 16), np.ones((scale, scale)))
      pixels = tf.constant(pixels[..., None], tf.uint8)
      folder = root / name / ('more' if i % 4 == 3 else '')
      folder.mkdir(parents=True, exist_ok=True)
      if i % 3 == 2:
        (folder / f'{i}.jpg').write_bytes(tf.io.encode_jpeg(pixels).numpy())
      else:
        (folder / f'{i}.png').write_bytes(tf.io.encode_png(pixels).numpy())
  damaged = root / 'three' / 'damaged.png'
  damaged.write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 40)
  (root / 'seven' / '.DS_Store').write_bytes(b'\0\0\0\1Bud1')
  return damaged


def xla_on_cpu():
  """False in the TPU build (tensorflow-tpu 2.20), which links no XLA CPU
  backend: "could not find registered transfer manager for platform Host"."""
  try:
    tf.function(lambda x: x, jit_compile=True).experimental_get_compiler_ir(
        tf.zeros(1))(stage='hlo')
    return True
  except ValueError as e:
    if 'transfer manager' in str(e):
      return False
    raise


# The modules that take longest (CI's junit times, the fast suite's and
# both slow tiers'), longest first: handed out first, so that on 2
# processes no long module starts last while the other idles. A module's
# tests stay together. pytest.ini's --no-loadscope-reorder keeps this
# order: pytest-xdist otherwise re-sorts modules by their number of tests.
LONGEST_FIRST = ('test_slurm', 'test_across_backends', 'test_jax_backend',
                 'test_scale_out', 'test_gcs_run', 'test_recipe_matrix',
                 'test_dali', 'test_finetune', 'test_models',
                 'test_tfrecord_run', 'test_mpirun', 'test_train_e2e',
                 'test_image_folder', 'test_csv_source', 'test_stopping',
                 'test_data', 'test_benchmark_sweep', 'test_pod_slice',
                 'test_compare', 'test_user_errors', 'test_notebook',
                 'test_train_in_process', 'test_precision', 'test_console')


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.module.__name__.rsplit('.')[-1],
                                       len(rank)))


def pytest_runtest_setup(item):
  """Skips what would start after CI's time budget (PIPELINE_TEST_DEADLINE).

  .ci/run sets it, as a Unix time, for its last tiers (JAX's, fast and
  slow, then TensorFlow's slow tier): a guard that keeps the whole run
  inside CI's limit should the tiers ever outgrow it. A test that starts
  before it runs to the end and counts; one that would start after it is
  reported as skipped, never as passed, and the run's last line counts it.
  """
  del item
  deadline = os.environ.get('PIPELINE_TEST_DEADLINE')
  if deadline and time.time() > float(deadline):
    pytest.skip('CI time budget spent (PIPELINE_TEST_DEADLINE)')


def check_progress_lines(output, total_steps):
  """Every progress line gives the gradient's norm (a positive finite
  number) and the time left: 'estimating' on the first (its execution
  compiled), then the run's end and the next evaluation, 'final eval next'
  on the last; the Done line gives the wall time. Returns the norms."""
  import math  # pylint: disable=g-import-not-at-top
  lines = re.findall(r'step (\d+)/%d \(epoch .*' % total_steps, output)
  found = re.findall(r'step (\d+)/%d \(epoch [^)]*\): .* grad norm '
                     r'([\d.e+-]+), lr .*; (.*)$' % total_steps, output, re.M)
  assert found and len(found) == len(lines), output[-3000:]
  norms = [float(norm) for _, norm, _ in found]
  assert all(math.isfinite(n) and n > 0 for n in norms), found
  assert found[0][2] == 'time left: estimating', found
  assert found[-1][0] == str(total_steps), found
  assert found[-1][2] == 'final eval next', found
  for step, _, left in found[1:-1]:
    assert re.fullmatch(r'(\d+m )?\d+s left, next eval in (\d+m )?\d+s',
                        left), (step, left)
  assert re.search(r'Done: eval_accuracy .* wall time (\d+m )?\d+s, ',
                   output), output[-2000:]
  return norms


def tree_digest(root):
  """SHA-256 over every file's path and bytes under `root`: unchanged or not."""
  import hashlib  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  for folder, _, files in sorted(os.walk(root)):
    for name in sorted(files):
      path = os.path.join(folder, name)
      digest.update(path.encode())
      with open(path, 'rb') as f:
        digest.update(f.read())
  return digest.hexdigest()


def signal_once_it_prints(process, text, signum=signal.SIGTERM, group=False,
                          times=1):
  """Reads `process`'s stderr until a line holds `text`, then sends it
  `signum` `times` times, 50 ms apart (to its whole process group if
  `group`, as a terminal's Ctrl-C or a VM's shutdown does: start it with
  process_group=0); returns what was read (the rest stays in the pipe)."""
  lines = []
  while not any(text in line for line in lines):
    line = process.stderr.readline()
    assert line or process.poll() is None, ''.join(lines)[-3000:]
    lines.append(line)
  for i in range(times):
    if i:
      time.sleep(0.05)
    if group:
      os.killpg(process.pid, signum)
    else:
      process.send_signal(signum)
  return ''.join(lines)


def sigterm_groups_once_it_prints(processes, text, signalled, timeout=600):
  """SIGTERM to the process group of each `processes[i]`, i in `signalled`,
  once the first of them printed `text` (as a shutdown of those machines
  sends it; each process started with process_group=0); returns every
  process's stderr once all have ended."""
  first = signalled[0]
  head = signal_once_it_prints(processes[first], text, group=True)
  for i in signalled[1:]:
    os.killpg(processes[i].pid, signal.SIGTERM)
  outputs = [p.communicate(timeout=timeout)[1] for p in processes]
  outputs[first] = head + outputs[first]
  return outputs


def stopped_at_one_step(processes, outputs):
  """The step at which every one of `processes` (workers or hosts of one
  run) saved and stopped on SIGTERM: each exited 143 with its one line and
  no traceback, all at the same step."""
  import re  # pylint: disable=g-import-not-at-top
  steps = []
  for process, output in zip(processes, outputs):
    assert process.returncode == 143, output[-3000:]
    assert 'Traceback' not in output, output[-3000:]
    found = re.search(r'preempted: SIGTERM: checkpoint of step (\d+)', output)
    assert found, output[-3000:]
    steps.append(int(found.group(1)))
  assert len(set(steps)) == 1, steps
  return steps[0]


def console_filter_of(process):
  """The process id of a launcher's console filter (its child process that
  filters native stderr lines), once it has started. Told apart by its
  command line: the launcher has other, short-lived children (nvidia-smi's
  try), and one caught by chance would pass for a filter that has ended."""
  from pipeline.run import environment  # pylint: disable=g-import-not-at-top
  marker = environment._LOG_MARKER.encode()  # pylint: disable=protected-access

  def filters():
    with open(f'/proc/{process.pid}/task/{process.pid}/children') as f:
      children = [int(p) for p in f.read().split()]
    found = []
    for child in children:
      try:
        with open(f'/proc/{child}/cmdline', 'rb') as f:
          if marker in f.read():
            found.append(child)
      except FileNotFoundError:
        pass  # Ended meanwhile: not the filter, which outlives its run.
    return found
  deadline = time.time() + 60
  while not filters():
    assert time.time() < deadline and process.poll() is None
    time.sleep(0.05)
  return filters()[0]


def wait_until_gone(pid, bound_s):
  """Waits until process `pid` has ended (or is a zombie nobody reaped
  yet), failing after `bound_s`."""
  deadline = time.time() + bound_s
  while True:
    try:
      with open(f'/proc/{pid}/stat') as f:
        if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
          return
    except FileNotFoundError:
      return
    assert time.time() < deadline, f'process {pid} still runs after {bound_s} s'
    time.sleep(0.1)


def check_tflite_agrees_with_the_saved_model(export_dir, atol):
  """The LiteRT interpreter on model.tflite against the SavedModel on the
  same uint8 images: probabilities within `atol` (float32 LiteRT weights
  against a float32 SavedModel agree to rounding; float16 weights or a
  bfloat16 SavedModel, to their precision)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  images = np.random.RandomState(1).randint(0, 256, (4, 32, 32, 3)).astype(
      np.uint8)
  saved_model = tf.saved_model.load(export_dir)  # Held: it owns the weights.
  expected = saved_model.serve(images).numpy()
  interpreter = Interpreter(model_path=os.path.join(export_dir, 'model.tflite'))
  interpreter.allocate_tensors()
  source, target = (interpreter.get_input_details()[0],
                    interpreter.get_output_details()[0])
  assert source['dtype'] == np.uint8 and target['dtype'] == np.float32
  for image, probabilities in zip(images, expected):
    interpreter.set_tensor(source['index'], image[None])
    interpreter.invoke()
    np.testing.assert_allclose(interpreter.get_tensor(target['index'])[0],
                               probabilities, atol=atol)
  assert workdirs.read_json(os.path.join(export_dir, 'metadata.json'))[
      'tflite'] == 'model.tflite'


def check_onnx_agrees_with_the_saved_model(export_dir):
  """The export's model.onnx (onnxruntime) against its SavedModel
  (TensorFlow) on 32 uint8 images other than the export's own check:
  probabilities within the export's tolerance, 1e-4 (both float32), and
  metadata.json saying what the export measured."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from pipeline.reports import predict  # pylint: disable=g-import-not-at-top
  saved_model, metadata = predict.load(str(export_dir))
  onnx, same = predict.load(os.path.join(export_dir, 'model.onnx'))
  assert same == metadata and metadata['onnx'] == 'model.onnx'
  assert metadata['onnx_checked_against'] == 'the SavedModel'
  assert metadata['onnx_tolerance'] == 1e-4
  assert 0 <= metadata['onnx_max_difference'] <= 1e-4
  size = metadata['preprocessing']['image_size']
  images = np.random.RandomState(7).randint(
      0, 256, (32, size, size, 3)).astype(np.uint8)
  theirs = predict.probabilities(saved_model, images)
  ours = predict.probabilities(onnx, images)
  assert ours.shape == theirs.shape == (32, len(metadata['class_names']))
  assert np.abs(ours - theirs).max() <= 1e-4


def check_keras_file_trains(export_dir, python=None, backend=None):
  """The export's model.keras, in a fresh process of `python` (this one's
  by default) on Keras' `backend` (the environment's by default): read by
  keras.models.load_model with nothing of this project imported, it gives
  the classes' logits and trains one more step with fit."""
  script = (
      'import sys, keras, numpy as np\n'
      'model = keras.models.load_model(sys.argv[1])\n'
      'images = np.random.RandomState(0).randint(0, 256, (8, 32, 32, 3))\n'
      'before = [w.copy() for w in model.get_weights()]\n'
      'model.compile(optimizer="adam", loss=keras.losses.'
      'SparseCategoricalCrossentropy(from_logits=True))\n'
      'history = model.fit(images.astype("uint8"), np.arange(8) % 10, '
      'epochs=1, batch_size=8, verbose=0).history\n'
      'moved = sum(not np.array_equal(a, b) for a, b in '
      'zip(before, model.get_weights()))\n'
      'print(model.output.shape, len(history["loss"]), moved > 0)\n')
  env = dict(os.environ, **({'KERAS_BACKEND': backend} if backend else {}))
  result = subprocess.run(
      [python or sys.executable, '-c', script,
       os.path.join(export_dir, 'model.keras')], cwd='/', env=env,
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().splitlines()[-1] == '(None, 10) 1 True', (
      result.stdout)


def check_exports_agree(export_dir, other_dir, atol):
  """Two exports' SavedModels on the same uint8 images: probabilities within
  `atol`, and the same metadata.json but for what each export measured of
  its own ONNX file (each within the export's tolerance)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from pipeline.reports import export  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  images = np.random.RandomState(2).randint(0, 256, (4, 32, 32, 3)).astype(
      np.uint8)
  saved_models = [tf.saved_model.load(path)  # Held: they own the weights.
                  for path in (export_dir, other_dir)]
  np.testing.assert_allclose(*[m.serve(images).numpy() for m in saved_models],
                             atol=atol)
  metadata = [workdirs.read_json(os.path.join(path, 'metadata.json'))
              for path in (export_dir, other_dir)]
  measured = [m.pop('onnx_max_difference', None) for m in metadata]
  assert all(d is None or d <= export.ONNX_TOLERANCE for d in measured)
  assert metadata[0] == metadata[1]


class Emulator:
  """A real GCS server (gcp-storage-emulator) on a free loopback port.

  Stores on disk under its own directory, so stop() and start() keep the
  objects, as a network outage would (its port is free_port()'s, which a
  retrying client cannot hold meanwhile).
  """

  def __init__(self, root):
    self.port = free_port()
    self.root = root
    self.host = f'http://127.0.0.1:{self.port}'
    self.process = None

  def start(self):
    import socket  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top
    binary = os.path.join(os.path.dirname(sys.executable),
                          'gcp-storage-emulator')
    log = os.path.join(self.root, 'emulator.log')
    with open(log, 'ab') as output:
      self.process = subprocess.Popen(
          [binary, 'start', '--host=127.0.0.1', f'--port={self.port}', '-q'],
          cwd=self.root, stdout=output, stderr=output)
    deadline = time.time() + 60
    while time.time() < deadline and self.process.poll() is None:
      try:
        socket.create_connection(('127.0.0.1', self.port), timeout=1).close()
        return
      except OSError:
        time.sleep(0.1)
    with open(log, encoding='utf-8', errors='replace') as f:
      tail = f.read()[-2000:]
    raise RuntimeError(f'gcp-storage-emulator did not start on port '
                       f'{self.port} (exit {self.process.poll()}): {tail}')

  def stop(self):
    if self.process:
      self.process.terminate()
      self.process.wait(timeout=30)
      self.process = None

  def client(self):
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    return storage.Client(project='test')

  def names(self, bucket, prefix=''):
    return sorted(b.name for b in self.client().list_blobs(bucket,
                                                           prefix=prefix))


@pytest.fixture(scope='module')
def emulator(tmp_path_factory):
  """A started emulator with bucket 'runs'; STORAGE_EMULATOR_HOST points at it."""
  server = Emulator(str(tmp_path_factory.mktemp('gcs')))
  server.start()
  previous = os.environ.get('STORAGE_EMULATOR_HOST')
  os.environ['STORAGE_EMULATOR_HOST'] = server.host
  os.environ.setdefault('GOOGLE_CLOUD_PROJECT', 'test')
  server.client().create_bucket('runs')
  yield server
  server.stop()
  if previous is None:
    os.environ.pop('STORAGE_EMULATOR_HOST', None)
  else:
    os.environ['STORAGE_EMULATOR_HOST'] = previous


def tensorflow_files(io_device=None, **trackables):
  """Checkpointer's `files`: TensorFlow's own files of `trackables`."""
  from pipeline.storage import checkpoint_files  # pylint: disable=g-import-not-at-top
  return lambda directory, keep: checkpoint_files.TensorFlowFiles(
      trackables, directory, keep, io_device)
