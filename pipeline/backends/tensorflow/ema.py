"""The moving average on TensorFlow (recipe/moving_average.py has the rule).

Not Keras 3's optimizer option `use_ema`: it averages trainable variables
only, counts steps the loss scale skipped, and evaluates by overwriting the
model's variables with no way back to the raw ones. Not TensorFlow's
`tf.train.ExponentialMovingAverage` either: in a replica context its
`assign_moving_average` does a merge_call that all-reduces every averaged
variable at every step (the whole model, each step), where the values are
equal on every replica already, and it takes tf.Variables, not Keras 3's.

The averages are float32 under every policy (the model's variables are),
updated in the replica step after each applied update (a step the loss
scale skipped leaves them alone), on each replica from its own copy
(ON_READ variables: no cross-replica traffic per step).
"""

import contextlib

import tensorflow as tf

from pipeline.recipe import moving_average


class _Averages(tf.Module):
  """The checkpointed part: one float32 variable per averaged variable."""

  def __init__(self, sources):
    super().__init__(name='ema')
    self.values = [
        tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                    name=v.name.replace(':', '_').replace('/', '_'),
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.MEAN)
        for v in sources]


class MovingAverage:
  """The moving average of `model`'s float variables; build in the scope."""

  def __init__(self, model, decay):
    self.decay = decay
    self.sources = moving_average.averaged(model)
    self.averages = _Averages(self.sources)
    self.reset()

  @property
  def trackable(self):
    """What a checkpoint saves as 'ema'."""
    return self.averages

  def averages_of(self, variables):
    """The averages of those of `variables` that are averaged."""
    index = {id(source): i for i, source in enumerate(self.sources)}
    return [self.averages.values[index[id(v)]] for v in variables
            if id(v) in index]

  def reset(self):
    """Starts the average at the model's current weights."""
    for source, average in zip(self.sources, self.averages.values):
      average.assign(source.value)

  def update(self, num_updates, applied):
    """In the replica step: one averaging step if `applied` (a bool tensor).

    `num_updates` counts applied updates, this one included.
    """
    decay = moving_average.decay_at(self.decay, num_updates)
    rate = (1.0 - decay) * tf.cast(applied, tf.float32)
    for source, average in zip(self.sources, self.averages.values):
      average.assign_sub(rate * (average - source.value))

  @contextlib.contextmanager
  def applied_to_model(self):
    """The model holds the averaged weights inside, its own ones after."""
    raw = [tf.identity(source.value) for source in self.sources]
    for source, average in zip(self.sources, self.averages.values):
      source.assign(average.read_value())
    try:
      yield
    finally:
      for source, value in zip(self.sources, raw):
        source.assign(value)
