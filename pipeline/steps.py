"""Compiled training and evaluation steps, several per call.

Keras 3.15's own multi-step loop (`steps_per_execution` > 1) fails under
MirroredStrategy: `model.fit` over 2 logical CPUs with steps_per_execution=4
raises "You must feed a value for placeholder tensor
'while/body/.../Placeholder_1'" from `multi_step_on_iterator` (measured;
BUILD_NOTES.md). This is the loop that works everywhere: one
tf.function runs `steps_per_execution` steps in a `tf.range` loop, each step
`strategy.run` on the next distributed batch, so the host is visited once
per execution, not once per step (what TPUs and fast GPUs need).
"""

import keras
import tensorflow as tf

from pipeline.errors import UserError

SUM = tf.distribute.ReduceOp.SUM


def make_optimizer(config, peak, total_steps, steps_per_epoch):
  """Optimizer with `peak` learning rate, linear warmup and cosine decay."""
  warmup_steps = min(int(config.warmup_epochs * steps_per_epoch),
                     max(total_steps - 1, 0))
  schedule = keras.optimizers.schedules.CosineDecay(
      initial_learning_rate=0.0, warmup_target=peak, warmup_steps=warmup_steps,
      decay_steps=max(total_steps - warmup_steps, 1))
  if config.optimizer == 'adamw':
    optimizer = keras.optimizers.AdamW(schedule,
                                       weight_decay=config.weight_decay)
  elif config.optimizer == 'sgd':
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True,
                                     weight_decay=config.weight_decay)
  else:
    raise UserError(f'unknown optimizer {config.optimizer!r}; accepted: '
                    'adamw, sgd')
  # Decay only weight matrices: decaying norms and biases hurts small models.
  optimizer.exclude_from_weight_decay(var_names=['bn', 'bias', 'gamma',
                                                 'beta'])
  return optimizer


def replica_train_step(model, optimizer, global_batch_size, num_classes,
                       label_smoothing, jit_compile=False):
  """One replica's step on its batch: forward, backward, summed gradients,
  update. Returns (loss, correct predictions)."""
  loss_fn = keras.losses.CategoricalCrossentropy(
      from_logits=True, label_smoothing=label_smoothing, reduction=None)
  _apply_without_all_reduce(optimizer)

  # TPUs compile the whole step anyway; elsewhere XLA is opt-in per step.
  @tf.function(jit_compile=jit_compile or None)
  def replica_step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      per_example = loss_fn(tf.one_hot(labels, num_classes), logits)
      # Each replica divides by the global batch: gradients are then summed.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch_size)
      scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    # Summed here, not inside optimizer.apply: LossScaleOptimizer decides to
    # skip a step from the gradients it is given, before its inner optimizer
    # would sum them, so each replica must already hold the sum (else one
    # replica's inf reaches the weights as NaN; BUILD_NOTES.md).
    grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
    optimizer.apply(grads, model.trainable_variables)
    correct = tf.reduce_sum(tf.cast(
        tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
        tf.float32))
    return loss, correct

  return replica_step


def batch_norm_averager(model):
  """A replica function that averages every batch norm's moving statistics
  across replicas, or None for a model without batch norm.

  Keras 3 creates moving statistics with aggregation NONE and updates them
  from each replica's own batch: without this, replicas and workers drift
  apart and a checkpoint holds only the first replica's.
  """
  statistics = _batch_norm_statistics(model)
  if not statistics:
    return None

  def average():
    context = tf.distribute.get_replica_context()
    local = [tf.identity(v.value) for v in statistics]
    averaged = context.all_reduce(tf.distribute.ReduceOp.MEAN, local)
    for variable, value in zip(statistics, averaged):
      variable.assign(value)

  return average


def make_train_function(model, optimizer, strategy, global_batch_size,
                        num_classes, label_smoothing, step, jit_compile):
  """Returns train(iterator, num_steps) -> dict of scalars.

  Batches are (images, labels) or data.py's (images, labels, skipped): then
  `skipped_records` sums the records the input skipped.

  `step` counts every step taken, including those LossScaleOptimizer skips
  for non-finite gradients; `optimizer.iterations` counts applied updates,
  so their difference is the number of skipped steps.
  """
  replica_step = replica_train_step(model, optimizer, global_batch_size,
                                    num_classes, label_smoothing, jit_compile)
  average_batch_norm_statistics = batch_norm_averager(model)

  @tf.function
  def train(iterator, num_steps):
    loss_sum = tf.constant(0.0)
    correct_sum = tf.constant(0.0)
    wait_s = tf.constant(0.0, tf.float64)
    skipped_sum = tf.constant(0)
    for _ in tf.range(num_steps):
      # Stateful ops run in program order, so this brackets the fetch alone.
      start = tf.timestamp()
      batch = next(iterator)
      with tf.control_dependencies(tf.nest.flatten(
          strategy.experimental_local_results(batch))):
        wait_s += tf.timestamp() - start
      loss, correct = strategy.run(replica_step, args=batch[:2])
      loss_sum += strategy.reduce(SUM, loss, axis=None)
      correct_sum += strategy.reduce(SUM, correct, axis=None)
      if len(batch) > 2:  # Records the input skipped (data.py).
        skipped_sum += strategy.reduce(
            SUM, strategy.run(tf.reduce_sum, args=batch[2:]), axis=None)
      step.assign_add(1)
    if strategy.num_replicas_in_sync > 1 and average_batch_norm_statistics:
      strategy.run(average_batch_norm_statistics)
    steps = tf.cast(num_steps, tf.float32)
    return {'loss': loss_sum / steps,
            'accuracy': correct_sum / (steps * global_batch_size),
            'input_wait_s': wait_s, 'skipped_records': skipped_sum}

  return train


def _apply_without_all_reduce(optimizer):
  """Makes `optimizer.apply` take gradients that are already summed.

  Keras' TensorFlow optimizers sum gradients across replicas inside
  `apply`; our replica step sums them first, so a second sum would multiply
  them by the number of replicas. A loss-scaled optimizer's inner optimizer
  is the one that sums.
  """
  inner = getattr(optimizer, 'inner_optimizer', optimizer)
  if not hasattr(inner, '_all_reduce_sum_gradients'):
    raise RuntimeError(f'{type(inner).__name__} no longer has '
                       '_all_reduce_sum_gradients; update steps.py for this '
                       'Keras version')
  inner._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars  # pylint: disable=protected-access


def _batch_norm_statistics(model):
  """The moving mean and variance of every BatchNormalization, nested too."""
  found, layers = [], list(model.layers)
  while layers:
    layer = layers.pop()
    if isinstance(layer, keras.Model):
      layers.extend(layer.layers)
    elif isinstance(layer, keras.layers.BatchNormalization):
      found.extend([layer.moving_mean, layer.moving_variance])
  return found


def replica_eval_step(model, num_classes):
  """One replica's eval batch: sums of loss, hits, top-5 hits and weights,
  and its confusion matrix. Padding examples carry weight 0."""
  loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True,
                                                 reduction=None)
  top_k = min(5, num_classes)

  def replica_step(images, labels, weights):
    logits = model(images, training=False)
    loss = tf.reduce_sum(loss_fn(tf.one_hot(labels, num_classes), logits) *
                         weights)
    predicted = tf.argmax(logits, -1, output_type=tf.int32)
    hits = tf.cast(tf.equal(predicted, labels), tf.float32)
    in_top_k = tf.cast(tf.math.in_top_k(labels, logits, top_k), tf.float32)
    confusion = tf.math.confusion_matrix(labels, predicted, num_classes,
                                         weights=weights, dtype=tf.float32)
    sums = tf.stack([loss, tf.reduce_sum(hits * weights),
                     tf.reduce_sum(in_top_k * weights), tf.reduce_sum(weights)])
    return sums, confusion

  return replica_step


def make_eval_function(model, strategy, num_classes):
  """Returns evaluate(iterator, num_steps) -> loss, accuracy, top-5 accuracy,
  examples and the confusion matrix (rows: true class, columns: predicted).
  """
  replica_step = replica_eval_step(model, num_classes)

  @tf.function
  def evaluate(iterator, num_steps):
    totals = tf.zeros(4)
    confusion = tf.zeros((num_classes, num_classes))
    for _ in tf.range(num_steps):
      sums, matrix = strategy.run(replica_step, args=next(iterator))
      totals += strategy.reduce(SUM, sums, axis=None)
      confusion += strategy.reduce(SUM, matrix, axis=None)
    loss, correct, correct_top_k, examples = tf.unstack(totals)
    return {'loss': loss / examples, 'accuracy': correct / examples,
            'top5_accuracy': correct_top_k / examples, 'examples': examples,
            'confusion': confusion}

  return evaluate
