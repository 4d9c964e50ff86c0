"""The GPU requirements resolve, with every NVIDIA wheel pinned.

Slow tier: `pip install --dry-run` resolves against the package registry
(the only network CI has) without installing anything.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO


def _pins(path):
  with open(path) as f:
    return dict(re.findall(r'^([A-Za-z0-9_.\-\[\]]+)==(\S+)', f.read(), re.M))


@pytest.mark.slow
def test_the_gpu_requirements_resolve_with_every_nvidia_wheel_pinned(
    tmp_path):
  report = tmp_path / 'report.json'
  result = subprocess.run(
      [sys.executable, '-m', 'pip', 'install', '--dry-run', '--quiet',
       '--ignore-installed', '--report', str(report), '-r',
       os.path.join(REPO, 'requirements-gpu.txt')],
      capture_output=True, text=True, timeout=900, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  resolved = {item['metadata']['name']: item['metadata']['version']
              for item in json.loads(report.read_text())['install']}
  nvidia = {name: version for name, version in resolved.items()
            if name.startswith('nvidia-')}
  pins = _pins(os.path.join(REPO, 'requirements-gpu.txt'))
  assert len(nvidia) == 12
  assert nvidia == {name: pins[name] for name in nvidia}  # All pinned.
  cudnn = tuple(int(p) for p in nvidia['nvidia-cudnn-cu12'].split('.')[:2])
  assert cudnn >= (9, 24)
  assert resolved['tensorflow'] == '2.21.0'
