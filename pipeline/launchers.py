"""The modules the library starts as processes of their own (`python -m
NAME`), named here alone: no import shows such a dependency, so this
module does, and a layout test holds the rest of the library to it.
"""

import enum
import sys


class Launcher(enum.StrEnum):
  """A module the library runs in a child process, and why there."""
  # A run timed from its start (a comparison), or a pod worker's trainer.
  TRAIN = 'launch.train'
  # The JAX route measured with no TensorFlow in the process.
  PROBE = 'launch.probe'
  # One backend a process: each imports its own framework.
  BENCHMARK = 'launch.benchmark'
  MAKE_TFRECORDS = 'launch.make_tfrecords'
  # Keras' own model.fit beside a run, in the same policy.
  KERAS_FIT = 'launch.keras_fit'
  # Keras' own training code on a folder of images: the race's peer.
  KERAS_PEER = 'pipeline.reports.compare.keras_peer'
  # An export task on Keras' TensorFlow backend, from a JAX process.
  EXPORT_TASK = 'pipeline.backends.tensorflow_exports'


def command(launcher, *args, python=sys.executable):
  """The command line that runs `launcher` with `args`."""
  return [python, '-m', str(launcher), *args]
