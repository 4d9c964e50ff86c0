"""The moving average of the weights (recipe/moving_average.py) as a
function of the JAX trainer's state: updated inside the compiled step,
swapped into the model to evaluate and export."""

import contextlib

import jax.numpy as jnp

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
    self.trainer = None

  def of(self, state):
    """The averaged variables' current values in `state`."""
    return [state[kind][index] for kind, index in self.places]

  def update(self, state, num_updates):
    """The averages after one applied update (the `num_updates`th)."""
    decay = moving_average.decay_at(self.decay, num_updates)
    return [average - (1.0 - decay) * (average - value)
            for average, value in zip(state['ema'], self.of(state))]

  def as_model_state(self, state):
    """(trainable, non_trainable) with the averages in place of the weights."""
    trainable = list(state['trainable'])
    non_trainable = list(state['non_trainable'])
    lists = {'trainable': trainable, 'non_trainable': non_trainable}
    for (kind, index), average in zip(self.places, state['ema']):
      lists[kind][index] = average
    return trainable, non_trainable

  def reset(self):
    """Starts the average at the model's current weights."""
    if self.trainer:  # Copies: the train program donates the state.
      self.trainer.state['ema'] = [jnp.copy(value) for value in
                                   self.of(self.trainer.state)]

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
      for variable, value in zip(variables, on_host(
          state['trainable'] + state['non_trainable'])):
        variable.assign(value)
