"""The moving average of the weights (recipe/moving_average.py) as a
function of the JAX trainer's state: updated inside the compiled step,
swapped into the model to evaluate and export.

In the state the averages are one float32 vector, every averaged weight
flattened into it in order: the update is then one elementwise pass XLA
fuses with the gathering of the weights, where one array per weight was
a kernel per weight (B0: 312) every step, the launches costing more than
the 21 MB they move.
"""

import contextlib

import jax.numpy as jnp
import numpy as np

from pipeline.backends.jax.programs import on_host
from pipeline.recipe import moving_average


class MovingAverage:
  """The moving average (recipe/moving_average.py) as a function of the
  JAX state."""

  def __init__(self, model, decay, variables=None):
    """`variables`: a layer whose `values` are Keras variables shaped like
    the averaged weights, where the average is saved (the trainer's
    checkpoint part); None where it is never saved (launch.probe)."""
    self.decay = decay
    sources = moving_average.averaged(model)
    self.variables = variables
    for average, source in zip(variables.values if variables else (),
                               sources):
      average.assign(source.value)  # The average starts at the weights.
    # Where each averaged weight sits in the state: (trainable?, index).
    trainable = {id(v): i for i, v in enumerate(model.trainable_variables)}
    non_trainable = {id(v): i
                     for i, v in enumerate(model.non_trainable_variables)}
    self.places = [('trainable', trainable[id(v)]) if id(v) in trainable else
                   ('non_trainable', non_trainable[id(v)]) for v in sources]
    self.shapes = [tuple(v.shape) for v in sources]
    self.trainer = None

  def of(self, state):
    """The averaged variables' current values in `state`."""
    return [getattr(state, kind)[index] for kind, index in self.places]

  @staticmethod
  def flat(values):
    """The state's form of the averages: `values` flattened into one vector
    (numpy arrays or JAX's, inside a program or out)."""
    xnp = np if all(isinstance(v, np.ndarray) for v in values) else jnp
    return xnp.concatenate([xnp.ravel(v) for v in values])

  def values(self, flat):
    """The averages, one array per weight, from the state's vector."""
    sizes = [int(np.prod(shape)) for shape in self.shapes]
    pieces = jnp.split(flat, np.cumsum(sizes)[:-1]) if sizes else []
    return [piece.reshape(shape) for piece, shape in zip(pieces, self.shapes)]

  def update(self, state, num_updates):
    """The averages' vector after one applied update (the `num_updates`th)."""
    decay = moving_average.decay_at(self.decay, num_updates)
    average = state.ema
    return average - (1.0 - decay) * (average - self.flat(self.of(state)))

  def as_model_state(self, state):
    """(trainable, non_trainable) with the averages in place of the weights."""
    trainable = list(state.trainable)
    non_trainable = list(state.non_trainable)
    lists = {'trainable': trainable, 'non_trainable': non_trainable}
    for (kind, index), average in zip(self.places, self.values(state.ema)):
      lists[kind][index] = average
    return trainable, non_trainable

  def reset(self):
    """Starts the average at the model's current weights."""
    if self.trainer:  # A new array: the train program donates the state.
      state = self.trainer.state
      self.trainer.state = state.replace(ema=self.flat(self.of(state)))

  @contextlib.contextmanager
  def applied_to_model(self, model, state):
    """The model's variables hold the averages inside, the weights after."""
    variables = model.trainable_variables + model.non_trainable_variables
    trainable, non_trainable = self.as_model_state(state)
    for variable, value in zip(variables, on_host(trainable + non_trainable)):
      variable.assign(value)
    try:
      yield
    finally:
      for variable, value in zip(variables, on_host(state.weights())):
        variable.assign(value)
