"""The two checkpoint formats, each written by one backend, read by both.

TensorFlowFiles: tf.train.Checkpoint's files, which the TensorFlow backend
writes; TensorFlowFileReader reads them into Keras variables on any
backend. KerasFiles: Keras' own `.weights.h5`, which the JAX backend writes
and every backend reads. Each is the local layer of
storage.checkpoint.Checkpointer: save(step), latest(), paths(directory),
restore(path, optional) -> the optional parts the file lacks.

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
# Private, as no public API serves: keras.Model.save_weights calls
# saving_lib.save_weights_only, but on a Model, which files its parts under
# 'layers/' where these files (since the first JAX runs) hold them at the top.
from keras.src.saving import saving_lib
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from pipeline.errors import UserError
from pipeline.storage.checkpoint_format import Format

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
  """Keras files of `parts`: names mapped to what is saved under them (a
  model, an optimizer, Variables); restoring reads only those present here.

  `read_only`: the one line a save raises instead (a run read by the other
  backend). A trainer whose state lives elsewhere (the JAX trainer's
  arrays) moves it into the variables before a save and back after a
  restore itself, around these.
  """

  def __init__(self, parts, directory, max_to_keep, read_only=None):
    self.parts = parts
    self.directory = directory
    self.max_to_keep = max_to_keep
    self.read_only = read_only
    os.makedirs(directory, exist_ok=True)

  def save(self, step):
    if self.read_only:
      raise UserError(self.read_only)
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


class TensorFlowFiles:
  """The local layer for TensorFlow: tf.train.CheckpointManager saves
  `<directory>/ckpt-N.index` and `.data-*`, renames them into place, then
  rewrites its `checkpoint` state file: the commit marker."""

  def __init__(self, trackables, directory, max_to_keep, io_device=None):
    self.trackables = trackables
    self.checkpoint = tf.train.Checkpoint(**trackables)
    # A TPU Node's variables live on remote hosts, which would otherwise
    # read and write the files there; '/job:localhost' keeps them here.
    self.options = tf.train.CheckpointOptions(experimental_io_device=io_device)
    self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                              max_to_keep=max_to_keep)

  def save(self, step):
    return self.manager.save(checkpoint_number=step, options=self.options)

  def latest(self):
    return self.manager.latest_checkpoint

  def paths(self, directory):
    """Committed checkpoints in `directory`, oldest first."""
    state = tf.train.get_checkpoint_state(directory)
    return list(state.all_model_checkpoint_paths if state else [])

  def restore(self, path, optional=()):
    """Restores `path`; returns the `optional` trackables it lacks."""
    saved = {name.split('/', 1)[0] for name, _ in tf.train.list_variables(path)}
    missing = [name for name in optional
               if name in self.trackables and name not in saved]
    checkpoint = (tf.train.Checkpoint(**{
        name: trackable for name, trackable in self.trackables.items()
        if name not in missing}) if missing else self.checkpoint)
    # Every object here restored; what the file has beyond them (another
    # run's optimizer, when fine-tuning from it) may stay unread.
    checkpoint.restore(path, options=self.options
                       ).assert_existing_objects_matched().expect_partial()
    return missing


class TensorFlowFileReader:
  """TensorFlow's checkpoint files read into Keras variables on any backend
  (a TensorFlow run evaluated, or fine-tuned from, on JAX): `roots` maps
  the checkpoint's top-level names (model, step, ema) to objects here.

  A TensorFlow checkpoint holds its object graph: every saved object's
  children by attribute name. Walking it from the roots and following the
  same attribute names from the same objects here
  (`model/_operations/2/_operations/101/moving_mean`: layers by their place
  in the Functional graph, which Keras builds alike on every backend;
  `ema/values/7`, whose Variables twin is also `values`) finds each
  variable, whichever path its key was saved under (often the
  optimizer's). The optimizer is not read: evaluating needs none. Never
  written: `read_only` is the line a save raises.
  """

  def __init__(self, roots, directory, read_only):
    self.roots, self.directory, self.read_only = roots, directory, read_only

  def save(self, step):
    raise UserError(self.read_only)

  def latest(self):
    found = self.paths(self.directory)
    return found[-1] if found else None

  @staticmethod
  def paths(directory):
    state = tf.train.get_checkpoint_state(directory)
    return list(state.all_model_checkpoint_paths if state else [])

  def restore(self, path, optional=()):
    """Restores `path`; returns the `optional` parts it lacks. ValueError
    where the file does not hold this model."""
    reader = tf.train.load_checkpoint(path)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
    found = {}  # Node id: the object here at the same attribute path.
    queue = []
    for child in graph.nodes[0].children:
      if child.local_name in self.roots:
        found[child.node_id] = self.roots[child.local_name]
        queue.append(child.node_id)
    missing = [n for n in optional if n in self.roots and not any(
        c.local_name == n for c in graph.nodes[0].children)]
    assigned = set()
    while queue:
      node = queue.pop(0)
      here = found[node]
      for attribute in graph.nodes[node].attributes:
        if attribute.name == 'VARIABLE_VALUE':
          here.assign(reader.get_tensor(attribute.checkpoint_key))
          assigned.add(id(here))
      for child in graph.nodes[node].children:
        if child.node_id in found:
          continue
        name = child.local_name
        try:
          found[child.node_id] = (
              here[int(name)] if isinstance(here, (list, tuple))
              else getattr(here, name))
        except (AttributeError, IndexError, ValueError, TypeError):
          continue  # TensorFlow-only bookkeeping, not a variable of ours.
        queue.append(child.node_id)
    unread = [v.path for v in self.roots['model'].weights
              if id(v) not in assigned]
    if unread:
      raise ValueError(f'{path} does not hold this model: {len(unread)} '
                       f'weights not found, e.g. {unread[0]}')
    return missing


def reader(written_as, parts, directory, read_only):
  """The reader of a run's checkpoints in Format `written_as` into `parts`:
  the model, and the step and moving average as Variables; never written
  (`read_only`: the line a save raises). `written_as` None (a run.json
  from before it named its format): the format its files are in."""
  readers = {
      Format.KERAS_WEIGHTS: lambda: KerasFiles(
          parts, directory, 1, read_only=read_only),
      # TensorFlow saves the step as a variable, the average as a list
      # `values`.
      Format.TF_CHECKPOINT: lambda: TensorFlowFileReader(
          dict(parts, **({'step': parts['step'].values[0]}
                         if 'step' in parts else {})),
          directory, read_only)}
  if written_as is None:
    return _ByItsFiles(readers[Format.KERAS_WEIGHTS](),
                       readers[Format.TF_CHECKPOINT]())
  return readers[written_as]()


class _ByItsFiles:
  """A reader of either format, by the files it is given: Keras' where a
  checkpoint's .weights.h5 is there, TensorFlow's otherwise."""

  def __init__(self, keras_files, tensorflow_files):
    self.keras, self.tensorflow = keras_files, tensorflow_files

  def save(self, step):
    return self.tensorflow.save(step)  # Read-only: raises its line.

  def latest(self):
    return self.keras.latest() or self.tensorflow.latest()

  def paths(self, directory):
    return self.keras.paths(directory) or self.tensorflow.paths(directory)

  def restore(self, path, optional=()):
    files = self.keras if os.path.exists(path + SUFFIX) else self.tensorflow
    return files.restore(path, optional)
