"""The two Keras backends behind one interface, and the choice between them.

`interface.py` declares what a backend is (`Backend`) and what its trainer
does (`Trainer`); `tensorflow/` and `jax/` implement it, each holding
everything that knows which backend runs: hardware and its strategy or
mesh, the compiled programs, what precision, XLA and the compile cache mean
there, the checkpoint format it writes, the profiler and the LiteRT writer.
The rest of the library reads `plan.backend` and calls the interface; only
this package names a backend. The backends never import each other; they
import what lies below them: recipe/ (what they compile), rules/, data/,
storage/ and pipeline.errors. tensorflow_exports.py writes the SavedModel
and LiteRT for both, hlo_cost.py counts both backends' FLOPs.

Keras reads its backend once, as it is imported, so the launchers call
`prepare(argv)` (through environment.prepare) before anything imports
Keras. This module and each backend's `__init__` import no TensorFlow, JAX
or Keras: the heavy modules load when a trainer or the hardware is built.

TensorFlow drives CPUs, GPUs and the TPUs its TPU build still reaches (TPU
Nodes, TPU VMs that run a TF 2.20 image). Today's TPUs mostly have no
TensorFlow TPU build: Colab's TPU runtimes ship JAX and no TensorFlow since
March 2025, the newest tensorflow-tpu is 2.20.0 (August 2025), and TPU7x
supports JAX and PyTorch only. There `auto` picks Keras' JAX backend, with
TensorFlow's CPU build still feeding tf.data.
"""

import importlib
import os
import sys

from pipeline.errors import UserError
from pipeline.rules.machine import cluster
from pipeline.rules.speed import measured
# What this machine has, read without loading TensorFlow or JAX; the
# backends call them as backends.installed(...) and so on.
from pipeline.rules.machine.probes import gpu_models  # pylint: disable=unused-import
from pipeline.rules.machine.probes import installed
from pipeline.rules.machine.probes import jax_installed
from pipeline.rules.machine.probes import tpu_attached

BACKENDS = ('auto', 'tensorflow', 'jax')
JAX_REQUIREMENTS = 'requirements-jax.txt'
_chosen = {}


def choose(requested, tpu, tensorflow_tpu=None, jax=None, attached=None,
           gpus=None, saved=None, environ=None, python=None):
  """Returns (backend, reason) for --backend=`requested` and --tpu=`tpu`.

  The keyword arguments stand in for what is installed and attached
  (tests): `gpus` the NVIDIA GPU models, `saved` a measured.load record,
  `environ` the process's variables, `python` its version; None looks. A
  one-line UserError for an unknown backend, or for the JAX route asked
  for or needed where it cannot run (no JAX, or an untested Python).
  """
  if requested not in BACKENDS:
    raise UserError(f'--backend={requested} is not a backend; accepted: '
                    f'{", ".join(BACKENDS)}')
  jax = jax_installed() if jax is None else jax
  name, reason = _choose(requested, tpu, tensorflow_tpu, jax, attached, gpus,
                         saved, os.environ if environ is None else environ)
  if name == 'jax':
    _check_jax_route(jax, python)
  return name, reason


def _choose(requested, tpu, tensorflow_tpu, jax, attached, gpus, saved,
            environ):
  if requested == 'jax' and tpu and tpu != 'local':
    raise UserError(f'--backend=jax cannot drive a TPU Node (--tpu={tpu}); '
                    'JAX runs on the TPU VM itself: --tpu=local there')
  if requested != 'auto':
    return requested, f'asked for with --backend={requested}'
  if tpu and tpu != 'local':
    return 'tensorflow', ('a TPU Node (--tpu=NAME or grpc://) is driven by '
                          "TensorFlow's TPU build")
  engine = cluster.from_environment(environ)
  if (engine and engine.num_processes > 1 and not engine.lists_hosts and jax
      and not environ.get('TF_CONFIG')):
    return 'jax', (f'{engine.engine} started {engine.num_processes} '
                   "processes without naming every host, which TensorFlow's "
                   'workers need; JAX joins through it')
  attached = tpu_attached() if attached is None else attached
  if not tpu and not attached:
    gpus = gpu_models() if gpus is None else gpus
    if gpus:
      return _on_gpus(gpus[0], jax, saved, environ)
    return 'tensorflow', 'no TPU: TensorFlow drives CPUs and GPUs'
  where = '--tpu=local' if tpu else 'a TPU is attached'
  tensorflow_tpu = (bool(installed('tensorflow-tpu')) if tensorflow_tpu is None
                    else tensorflow_tpu)
  if tensorflow_tpu:
    return 'tensorflow', f"{where} and TensorFlow's TPU build is installed"
  if not jax:
    raise UserError(
        f'{where}, but neither tensorflow-tpu nor JAX is installed; on '
        f"today's TPUs (Colab, TPU7x): pip install -r {JAX_REQUIREMENTS}")
  return 'jax', (f'{where} and no TensorFlow TPU build is installed '
                 '(tensorflow-tpu); Keras runs on JAX')


# The JAX route runs where CI runs it: jax 0.11, which needs Python 3.12.
JAX_PYTHON = (3, 12)


def _check_jax_route(jax, python=None):
  """A one-line UserError where the JAX route cannot run as tested: no
  JAX, or a Python older than JAX_PYTHON (jax 0.10, the last for 3.11, is
  a route no test runs)."""
  python = python or sys.version_info[:2]
  if tuple(python) < JAX_PYTHON:
    raise UserError(
        f'the JAX route runs on Python {".".join(map(str, JAX_PYTHON))} or '
        f'later (jax 0.11.2, the version tested); this is Python '
        f'{".".join(map(str, python))}: make the environment with '
        f'python3.12 -m venv and pip install -r {JAX_REQUIREMENTS}, or pass '
        '--backend=tensorflow')
  if not jax:
    raise UserError(f'--backend=jax needs JAX, which is not installed; '
                    f'pip install -r {JAX_REQUIREMENTS}')


def _on_gpus(gpu_name, jax, saved, environ):
  """(backend, reason) on a machine with NVIDIA GPUs: the backend the user
  measured faster on this GPU model and software (measured.py), else
  TensorFlow. JAX is not the rule: Keras' own JAX trainer ran B0 1.25x
  faster on an H100 (7,330 against 5,845 img/s, issue 34), but this
  project's JAX loop has not been measured on a GPU."""
  if environ.get('TF_CONFIG'):
    return 'tensorflow', 'TF_CONFIG joins TensorFlow workers'
  if jax:
    saved = measured.load(gpu_name, both_software()) if saved is None else saved
    if saved:
      return saved['backend'], saved['reason']
  return 'tensorflow', (
      f'{gpu_name}: TensorFlow, whose path here was measured on GPUs; no '
      'measurement of both backends is saved for this GPU (launch.benchmark '
      '--backends=tensorflow,jax --save_policy measures both and keeps the '
      'faster' + (')' if jax else ', with JAX installed: '
                  'requirements-gpu.txt)'))


def both_software():
  """The software of both backends: what a measurement of them holds for."""
  return '+'.join(load(name).software() for name in BACKENDS[1:])


def measured_policy(gpu_name, backend):
  """(policy, reason) the saved measurement of both backends ran `backend`
  under on this GPU model, or None."""
  saved = measured.load(gpu_name, both_software())
  if not saved or saved['backend'] != backend.name:
    return None
  return saved['policy'], saved['reason']


def prepare(requested, tpu):
  """Chooses the backend and tells Keras, which must not be imported yet."""
  name, reason = choose(requested or 'auto', tpu or '')
  os.environ['KERAS_BACKEND'] = name
  _chosen.update(name=name, reason=reason)


def current():
  """(backend, reason) of this process: what prepare() chose, else Keras'
  own setting (a test or a notebook that imports the library)."""
  if _chosen:
    return _chosen['name'], _chosen['reason']
  import keras  # pylint: disable=g-import-not-at-top
  name = keras.backend.backend()
  return name, f'Keras backend {name} (KERAS_BACKEND)'


def load(name):
  """The Backend called `name` ('tensorflow' or 'jax'); a run's own is
  `load(current()[0])`, carried by its plan."""
  if name not in BACKENDS[1:]:
    raise UserError(f'{name!r} is not a backend; accepted: '
                    f'{", ".join(BACKENDS[1:])}')
  return importlib.import_module(f'pipeline.backends.{name}').BACKEND


def chosen():
  """This process's Backend, with the reason it was chosen."""
  name, reason = current()
  return load(name), reason


def trained_on(resolved):
  """The Backend a run trained on, from its run.json 'resolved' object (a
  run from before there were two: TensorFlow)."""
  return load(resolved.get('backend', 'tensorflow'))
