"""Checkpoints every Keras backend reads: Keras' own `.weights.h5` files.

A JAX run's checkpoints must be read by `launch.evaluate`, `init_from` and
the export on a TensorFlow machine, and TensorFlow's checkpoint format
cannot hold JAX arrays. Keras' weights file can: Keras writes it from the
variables of any backend, keyed by the model's structure (layer names and
variable order), not by backend object ids, and reads it into the same
model built under another backend (measured: saved under JAX, loaded under
TensorFlow, equal values). It holds the optimizer's variables too, which
Orbax would also do, but Orbax needs JAX to read, and a TensorFlow machine
has none.

One checkpoint is one file, `<directory>/ckpt-N.weights.h5`, holding one
`RunState`: the model, the optimizer, the step and the moving average as
named groups. It is written under a temporary name and renamed into place:
a file under its final name is complete, the commit on a local disk (GCS
adds its own marker: checkpoint_gcs).
"""

import os
import re

import h5py
import keras
from keras.src.saving import saving_lib

from pipeline.errors import UserError

SUFFIX = '.weights.h5'


class Variables(keras.layers.Layer):
  """A named group of variables in a checkpoint (the step, the averages)."""

  def __init__(self, name, like=(), shapes=(), dtype='float32'):
    super().__init__(name=name)
    specs = [(v.shape, v.dtype) for v in like] or [(s, dtype) for s in shapes]
    self.values = [self.add_weight(shape=shape, dtype=kind, trainable=False,
                                   initializer='zeros', name=f'{name}_{i}')
                   for i, (shape, kind) in enumerate(specs)]
    self.built = True


class RunState(keras.layers.Layer):
  """The parts of a checkpoint, each a group named after its keyword."""

  def __init__(self, **parts):
    super().__init__(name='run_state')
    for name, part in parts.items():
      setattr(self, name, part)
    self.built = True


def saved_parts(path):
  """The parts (top-level groups) the checkpoint file at `path` holds."""
  with h5py.File(path, 'r') as file:
    return set(file.keys())


class KerasFiles:
  """The local layer of pipeline.checkpoint.Checkpointer for Keras files.

  `parts` maps names to what is saved under them (a model, an optimizer,
  Variables); restoring reads only those present here.
  """

  def __init__(self, parts, directory, max_to_keep):
    self.parts = parts
    self.directory = directory
    self.max_to_keep = max_to_keep
    os.makedirs(directory, exist_ok=True)

  def save(self, step):
    path = os.path.join(self.directory, f'ckpt-{step}')
    temporary = os.path.join(self.directory, f'.saving-ckpt-{step}{SUFFIX}')
    saving_lib.save_weights_only(RunState(**self.parts), temporary)
    os.replace(temporary, path + SUFFIX)
    for old in self.paths(self.directory)[:-self.max_to_keep]:
      os.remove(old + SUFFIX)
    return path

  def latest(self):
    found = self.paths(self.directory)
    return found[-1] if found else None

  @staticmethod
  def paths(directory):
    """Checkpoints (paths without the suffix) in `directory`, oldest first."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    steps = sorted(int(m.group(1)) for m in
                   (re.fullmatch(rf'ckpt-(\d+){re.escape(SUFFIX)}', n)
                    for n in names) if m)
    return [os.path.join(directory, f'ckpt-{step}') for step in steps]

  def restore(self, path, optional=()):
    """Restores `path`; returns the `optional` parts it lacks.

    Raises OSError for a missing or truncated file, ValueError for one that
    does not match the parts (another model).
    """
    saved = saved_parts(path + SUFFIX)
    missing = [name for name in optional
               if name in self.parts and name not in saved]
    saving_lib.load_weights_only(
        RunState(**{name: part for name, part in self.parts.items()
                    if name not in missing}), path + SUFFIX)
    return missing


class TensorFlowReader(KerasFiles):
  """A JAX run's checkpoints read by the TensorFlow trainer (launch.evaluate
  on a TensorFlow machine): the model, the step and the moving average.
  The optimizer is not read: evaluating needs none."""

  def __init__(self, trainer, directory, max_to_keep):
    self.trainer = trainer
    self.step = Variables('step', shapes=[()], dtype='int32')
    parts = dict(model=trainer.model, step=self.step)
    if trainer.ema:
      self.average = Variables('ema', like=trainer.ema.sources)
      parts['ema'] = self.average
    super().__init__(parts, directory, max_to_keep)

  def save(self, step):
    raise UserError(f'{self.directory} holds a run trained on JAX; it '
                    'resumes with --backend=jax')

  def restore(self, path, optional=()):
    missing = super().restore(path, optional)
    self.trainer.step.assign(int(self.step.values[0].numpy()))
    if 'ema' in self.parts and 'ema' not in missing:
      for average, value in zip(self.trainer.ema.averages.values,
                                self.average.values):
        average.assign(value.numpy())
    return missing
