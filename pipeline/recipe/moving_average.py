"""The moving average of the weights: what is evaluated and exported when on.

The rule, which both backends' averages follow (TensorFlow's as
replica-local variables, JAX's as part of the compiled state). As
tensorflow/tpu's EfficientNet (tf.train.ExponentialMovingAverage with
`num_updates`): every float variable of the model is averaged, batch-norm
moving statistics included (averaged weights with the raw weights'
statistics would normalise with figures measured for other weights), and
the decay warms up as min(decay, (1 + n) / (10 + n)) over the n applied
updates, so a short run or a fine-tuning run is not dominated by its
initial weights (0.9999 without warm-up keeps 90% of them for 1,000 steps).
A step the loss scale skipped is no update. The average starts at the
weights.
"""

import keras


def averaged(model):
  """The weights the average covers, in its order: every float32 variable
  (under every policy the model's variables are float32)."""
  return [w for w in model.weights if w.dtype == 'float32']


def decay_at(decay, num_updates):
  """The decay of the `num_updates`th applied update (a tensor of either
  backend, inside its compiled program)."""
  n = keras.ops.cast(num_updates, 'float32')
  return keras.ops.minimum(decay, (1.0 + n) / (10.0 + n))
