"""The GPU requirements resolve, with every NVIDIA wheel pinned.

`uv pip compile` resolves for a Linux x86-64 GPU machine from the package
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

REQUIREMENTS = os.path.join(REPO, 'requirements-gpu.txt')


def _pins(text):
  return dict(re.findall(r'^([A-Za-z0-9_.\-\[\]]+)==(\S+)', text, re.M))


# 3.11: this project's machines; 3.13: Colab's runtimes.
@pytest.mark.parametrize('python', ['3.11', '3.13'])
def test_the_gpu_requirements_resolve_with_every_nvidia_wheel_pinned(python):
  uv = os.path.join(os.path.dirname(sys.executable), 'uv')
  result = subprocess.run(
      [uv, 'pip', 'compile', '--quiet', '--no-cache', '--no-header',
       '--no-annotate', '--no-python-downloads', f'--python-version={python}',
       '--python-platform=x86_64-manylinux_2_28', REQUIREMENTS],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  resolved = _pins(result.stdout)
  nvidia = {name: version for name, version in resolved.items()
            if name.startswith('nvidia-')}
  with open(REQUIREMENTS) as f:
    pins = _pins(f.read())
  assert len(nvidia) == 12
  assert nvidia == {name: pins[name] for name in nvidia}  # All pinned.
  cudnn = tuple(int(p) for p in nvidia['nvidia-cudnn-cu12'].split('.')[:2])
  assert cudnn >= (9, 24)
  assert resolved['tensorflow'] == '2.21.0'
