"""Process settings TensorFlow reads once, as it loads: set them before.

Importable without TensorFlow; the launchers call `prepare(sys.argv)` in
their first lines, before anything imports TensorFlow.
"""

import argparse
import os


def requested_policy(argv):
  """The --policy value in `argv` (absl syntax), or None if not given."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  parser.add_argument('--policy', '-policy')
  known, _ = parser.parse_known_args(argv[1:])
  return known.policy


def prepare(argv):
  """Sets TensorFlow's load-time switches for the run `argv` asks for."""
  # Warnings and errors from TensorFlow's C++ side; its INFO lines are noise.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  if requested_policy(argv) == 'rewrite':
    # --policy=rewrite on a CPU is oneDNN's bfloat16 rewrite, and TensorFlow
    # leaves oneDNN off on CPUs without AVX-512. An explicit 0 is kept: the
    # run then stops in one line (precision.enable_graph_rewrite).
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')
