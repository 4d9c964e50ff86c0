"""Check what this project claims of GPUs on your GPU machine, in order,
within a budget, into one report.

  pip install -r requirements-gpu.txt && pip install -r requirements-dali-tf.txt
  python -m launch.gpu_checks --out=gpu-checks --budget_s=2700

Runs the JAX probe, both backends on 224 px photographs, tf.data against
DALI, the compile cache, replicas with and without XLA, and a whole run on
each backend (pipeline/reports/gpu_checks.py), skipping what would not end
within --budget_s. One line per check as it ends; everything in
OUT/report.json and OUT/report.txt, written after every check. Send
report.json with the GPU's name.
"""

import os

from absl import app
from absl import flags

from pipeline.reports import gpu_checks

_OUT = flags.DEFINE_string('out', 'runs/gpu-checks', 'The report folder.')
_BUDGET_S = flags.DEFINE_integer('budget_s', 2700, 'Seconds for all checks.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  os.makedirs(_OUT.value, exist_ok=True)
  out = os.path.abspath(_OUT.value)
  report = gpu_checks.run(out, _BUDGET_S.value)
  print(f'gpu_checks: done in {report["elapsed_s"]} s; {out}/report.txt')


if __name__ == '__main__':
  app.run(main)
