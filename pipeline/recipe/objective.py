"""What training minimises and evaluation counts: one definition for both
backends, in keras.ops, traced into TensorFlow's functions and JAX's jitted
programs alike.

Labels are class indices, or soft labels [batch, classes] (mixup, CutMix),
for which a prediction is correct if it is the dominant label. The L2 term
is tensorflow/tpu's EfficientNet's: l2 * sum(w**2) / 2 over every weight
but batch norm's, added to the loss (rather than a decoupled decay).
"""

import dataclasses

import keras
from keras import ops


@dataclasses.dataclass(frozen=True)
class Objective:
  """What a training step minimises, the one part of the recipe both
  backends' steps take: cross-entropy over the run's classes with label
  smoothing, plus the L2 term (0: none)."""
  num_classes: int
  label_smoothing: float = 0.0
  l2_weight_decay: float = 0.0

  def targets(self, labels):
    return targets(labels, self.num_classes)

  def per_example_loss(self):
    return loss_function(self.label_smoothing)

  def penalty(self, variables, values=None):
    """l2 * l2_penalty of the decayed `variables` (their `values`, where
    given: JAX's stateless ones), in float32."""
    values = [v.value for v in variables] if values is None else values
    return self.l2_weight_decay * l2_penalty(
        [w for v, w in zip(variables, values) if is_decayed(v)])


def loss_function(label_smoothing=0.0):
  """Per-example cross-entropy from logits, with label smoothing."""
  return keras.losses.CategoricalCrossentropy(
      from_logits=True, label_smoothing=label_smoothing, reduction=None)


def targets(labels, num_classes):
  """One-hot targets for class indices; soft labels as they are."""
  if len(labels.shape) == 2:
    return labels
  return ops.one_hot(labels, num_classes, dtype='float32')


def is_decayed(variable):
  """Whether the L2 term covers `variable`: not batch norm's scale or shift."""
  return not variable.path.endswith(('gamma', 'beta'))


def l2_penalty(values):
  """sum(w**2) / 2 over `values` (the decayed weights), in float32."""
  return sum(ops.sum(ops.square(ops.cast(w, 'float32'))) for w in values) / 2


def correct(logits, targets_):
  """How many predictions are the (dominant) label, as float32."""
  return ops.sum(ops.cast(ops.argmax(logits, -1) == ops.argmax(targets_, -1),
                          'float32'))


def eval_sums(logits, labels, weights, num_classes):
  """One eval batch's sums: [loss, hits, top-5 hits, weight] and its
  confusion matrix (rows: true class, columns: predicted). Padding
  examples weigh 0; a label is in the top k when fewer than k classes
  score higher (ties count in, as tf.math.in_top_k)."""
  logits = ops.cast(logits, 'float32')
  one_hot = ops.one_hot(labels, num_classes, dtype='float32')
  loss = ops.sum(loss_function()(one_hot, logits) * weights)
  predicted = ops.argmax(logits, -1)
  hits = ops.cast(predicted == ops.cast(labels, predicted.dtype), 'float32')
  label_logit = ops.sum(logits * one_hot, -1, keepdims=True)
  higher = ops.sum(ops.cast(logits > label_logit, 'float32'), -1)
  in_top_k = ops.cast(higher < min(5, num_classes), 'float32')
  confusion = ops.matmul(ops.transpose(one_hot * weights[:, None]),
                         ops.one_hot(predicted, num_classes, dtype='float32'))
  sums = ops.stack([loss, ops.sum(hits * weights), ops.sum(in_top_k * weights),
                    ops.sum(weights)])
  return sums, confusion
