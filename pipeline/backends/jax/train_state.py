"""The JAX trainer's state: one named pytree, as Flax's `TrainState`.

Keras keeps a run's state in its variables; JAX programs take and return
arrays. Between saves the state lives here: the model's variables (those
Keras trains and those it only updates, as `stateless_call` takes them),
the optimizer's, the step counter and the moving average's one vector
(ema.py). A program returns a new state (`replace`); its buffers are
donated to the next step, so nothing else holds on to them.
"""

import dataclasses
from typing import Any, Optional

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  trainable: list  # model.trainable_variables' values, in that order.
  non_trainable: list  # model.non_trainable_variables' (batch-norm moments).
  optimizer: list  # optimizer.variables' (iterations, slots, loss scale).
  step: Any  # Every step taken (skipped ones included), an int32 array.
  ema: Optional[Any] = None  # The moving averages as one vector, or None.

  def replace(self, **changes):
    """A copy with `changes` (the state is never changed in place)."""
    return dataclasses.replace(self, **changes)

  def weights(self):
    """The model's values: trainable then non-trainable, as the model's
    `trainable_variables + non_trainable_variables`."""
    return list(self.trainable) + list(self.non_trainable)
