"""The GPU and JAX TPU requirements resolve where they are installed.

`uv pip compile` resolves for a Linux x86-64 machine from the package
index's metadata alone, in seconds. `pip install --dry-run --report`, the
first way this was checked, downloads every wheel it resolves (3.4 GB here,
pip 26.3 with --no-cache-dir: TensorFlow, cuBLAS, cuDNN, ...), which ran
CI's disk full.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

GPU_REQUIREMENTS = os.path.join(REPO, 'requirements-gpu.txt')
# 3.11: this project's machines; 3.12: GPU VM images; 3.13: Colab's runtimes.
PYTHONS = ['3.11', '3.12', '3.13']


def _pins(text, python=None):
  """{name: version} pinned in `text`, for Python `python` where a pin has
  a python_version marker (e.g. '; python_version >= "3.12"')."""
  pins = {}
  for name, version, operator, bound in re.findall(
      r'^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)(?:; python_version ([<>=]+) '
      r'"([\d.]+)")?', text, re.M):
    if operator:
      ours, theirs = (tuple(map(int, v.split('.'))) for v in (python, bound))
      if not {'>=': ours >= theirs, '<': ours < theirs}[operator]:
        continue
    pins[name] = version
  return pins


def _compile(path, python, platform):
  """{package: version} that `path` resolves to, or a failed assertion."""
  uv = os.path.join(os.path.dirname(sys.executable), 'uv')
  result = subprocess.run(
      [uv, 'pip', 'compile', '--quiet', '--no-cache', '--no-header',
       '--no-annotate', '--no-python-downloads', f'--python-version={python}',
       f'--python-platform={platform}', path],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return _pins(result.stdout)


@pytest.mark.parametrize('python', PYTHONS)
def test_the_gpu_requirements_resolve_with_every_nvidia_wheel_pinned(python):
  resolved = _compile(GPU_REQUIREMENTS, python, 'x86_64-manylinux_2_28')
  nvidia = {name: version for name, version in resolved.items()
            if name.startswith('nvidia-')}
  pins = {}
  for name in ('requirements-gpu.txt', 'requirements-dali.txt'):
    with open(os.path.join(REPO, name)) as f:
      pins.update(_pins(f.read(), python))
  assert len(nvidia) == 20  # CUDA 14, DALI and its image codecs 6.
  assert nvidia == {name: pins[name] for name in nvidia}  # All pinned.
  cudnn = tuple(int(p) for p in nvidia['nvidia-cudnn-cu12'].split('.')[:2])
  assert cudnn >= (9, 24)
  assert resolved['tensorflow'] == '2.21.0'
  # Both backends in one environment, JAX with its CUDA plugin: 0.11.2,
  # which CI runs, from Python 3.12 on (it needs 3.12); none before, where
  # the JAX route is refused (tests/test_backend.py).
  for name in ('jax', 'jaxlib', 'jax-cuda12-pjrt', 'jax-cuda12-plugin'):
    if python == '3.11':
      assert name not in resolved, name
    else:
      assert resolved[name] == '0.11.2', name
      assert name == 'jax' or pins[name] == '0.11.2', name
  assert resolved['nvidia-dali-cuda120'] == pins['nvidia-dali-cuda120']


def test_dali_stays_out_of_the_cpu_and_tpu_requirements():
  for name in ('requirements.txt', 'requirements-tpu.txt',
               'requirements-jax.txt', 'requirements-test.txt'):
    with open(os.path.join(REPO, name)) as f:
      assert 'dali' not in f.read().lower(), name


@pytest.mark.parametrize('python', PYTHONS)
def test_the_jax_tpu_requirements_resolve_as_pinned(python):
  """requirements-jax.txt on a TPU host (libtpu's wheels need glibc 2.31):
  JAX, libtpu, Keras and TensorFlow's CPU build at their pins."""
  path = os.path.join(REPO, 'requirements-jax.txt')
  resolved = _compile(path, python, 'x86_64-manylinux_2_31')
  with open(path) as f:
    pins = _pins(f.read(), python)
  for name in ('tensorflow-cpu', 'keras'):
    assert resolved[name] == pins[name], name
  # JAX where CI runs it, Python 3.12 on; none on 3.11 (refused there).
  for name in ('jax[tpu]', 'jaxlib', 'libtpu'):
    if python == '3.11':
      assert name not in pins and name.split('[')[0] not in resolved, name
    else:
      assert resolved[name.split('[')[0]] == pins[name], name
  assert python == '3.11' or pins['jax[tpu]'] == '0.11.2'
  assert 'tensorflow' not in resolved  # Only the CPU build.


def test_the_tracking_requirements_change_nothing_requirements_txt_resolves(
    tmp_path):
  """requirements-tracking.txt installed beside requirements.txt (pip
  install -r requirements-tracking.txt into the training environment)
  downgrades nothing: every package requirements.txt resolves to resolves
  to the same version with the trackers added."""
  both = tmp_path / 'both.txt'
  both.write_text(f'-r {os.path.join(REPO, "requirements.txt")}\n'
                  f'-r {os.path.join(REPO, "requirements-tracking.txt")}\n')
  alone = _compile(os.path.join(REPO, 'requirements.txt'), '3.11',
                   'x86_64-manylinux_2_28')
  together = _compile(str(both), '3.11', 'x86_64-manylinux_2_28')
  assert len(alone) > 50 and {'mlflow', 'wandb'} <= set(together)
  changed = {name: (version, together.get(name))
             for name, version in alone.items()
             if together.get(name) != version}
  assert not changed
