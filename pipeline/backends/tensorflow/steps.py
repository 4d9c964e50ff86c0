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

import functools
import math

import keras
import tensorflow as tf

from pipeline.recipe import objective as objective_lib
from pipeline.recipe import optimizers

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN


def gradient_function(model, optimizer, global_batch_size, objective,
                      accumulation_steps=1):
  """Returns gradients(variables, images, labels) -> (scaled gradients,
  loss, correct predictions) of one replica's batch; `objective` (an
  objective_lib.Objective) says what the loss is.

  With `accumulation_steps` k > 1 the batch is cut into k micro-batches
  whose gradients are summed in a while loop (the activations of one
  micro-batch in memory at a time), so a step is still one update of the
  whole batch and a loss-scale skip drops all of it.
  """
  loss_fn = objective.per_example_loss()

  def gradients(variables, images, labels):
    targets = objective.targets(labels)
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      per_example = loss_fn(targets, logits)
      # Each replica divides by the global batch: gradients are then summed.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch_size)
      if objective.l2_weight_decay:
        # Each replica and micro-batch adds its share: summed, it is whole.
        replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        loss += objective.penalty(variables) / (replicas * accumulation_steps)
      scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, variables)
    grads = [tf.zeros(v.shape, v.dtype) if g is None else g
             for g, v in zip(grads, variables)]
    return grads, loss, objective_lib.correct(logits, targets)

  def accumulated(variables, images, labels):
    micro = lambda t: tf.reshape(t, [accumulation_steps, -1, *t.shape[1:]])
    images, labels = micro(images), micro(labels)

    def add(i, grads, loss, correct):
      more = gradients(variables, images[i], labels[i])
      return (i + 1, [a + b for a, b in zip(grads, more[0])],
              loss + more[1], correct + more[2])

    zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
    _, grads, loss, correct = tf.while_loop(
        lambda i, *_: i < accumulation_steps, add,
        (tf.constant(0), zeros, tf.constant(0.0), tf.constant(0.0)))
    return grads, loss, correct

  return gradients if accumulation_steps == 1 else accumulated


def replica_train_step(model, optimizer, global_batch_size, objective,
                       jit_compile=False, ema=None, replicas=1,
                       **gradient_options):
  """One replica's update on its batch: forward, backward, gradients summed
  across replicas, update, moving average. Returns (loss, correct
  predictions, the summed gradient's global norm before the loss scale
  and any clipping). `gradient_options`: gradient_function's keyword arguments.
  The optimizer must take summed gradients (make_train_function sees to it).

  `jit_compile` (not on TPUs, which compile the whole step anyway): XLA
  compiles the step of one replica whole. With `replicas` > 1 it compiles
  forward and backward alone: a compiled function can hold neither the
  cross-replica sum (a merge_call) nor, over MirroredStrategy, the update
  ("Trying to access resource .../replica_1 located in device CPU:1 from
  device CPU:0", measured; tensorflow#45940), so those run as TensorFlow
  ops after it.
  """
  gradients = gradient_function(model, optimizer, global_batch_size,
                                objective, **gradient_options)
  compile_gradients = jit_compile and replicas > 1

  # No autograph: the step has no Python control flow on tensors, and
  # converting it and the model's code adds seconds to every run's start.
  @tf.function(jit_compile=(jit_compile and not compile_gradients) or None,
               autograph=False)
  def replica_step(images, labels):
    # Read when traced: a frozen backbone's weights are not among them.
    variables = model.trainable_variables
    compute = functools.partial(gradients, variables)
    if compile_gradients:
      compute = tf.function(compute, jit_compile=True)
    grads, loss, correct = compute(images, labels)
    # Summed here, not inside optimizer.apply: LossScaleOptimizer decides to
    # skip a step from the gradients it is given, before its inner optimizer
    # would sum them, so each replica must already hold the sum (else one
    # replica's inf reaches the weights as NaN; BUILD_NOTES.md).
    grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
    grad_norm = tf.linalg.global_norm(
        [tf.cast(g, tf.float32) for g in grads]) / _loss_scale(optimizer)
    applied_before = tf.identity(optimizer.iterations.value)
    optimizer.apply(grads, variables)
    if ema:
      updates = tf.identity(optimizer.iterations.value)
      ema.update(updates, applied=updates > applied_before)
    return loss, correct, grad_norm

  return replica_step


def _loss_scale(optimizer):
  """What scale_loss multiplies the loss by (1 without float16)."""
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    return tf.cast(_value(optimizer.dynamic_scale), tf.float32)
  return tf.constant(1.0)


def batch_norm_averager(model, ema=None):
  """A replica function that averages every batch norm's moving statistics
  (and their moving averages) across replicas, or None for a model without
  batch norm.

  Keras 3 creates moving statistics with aggregation NONE and updates them
  from each replica's own batch: without this, replicas and workers drift
  apart and a checkpoint holds only the first replica's.
  """
  statistics = _batch_norm_statistics(model)
  if ema:
    statistics += ema.averages_of(statistics)
  if not statistics:
    return None

  def average():
    context = tf.distribute.get_replica_context()
    local = [tf.identity(_value(v)) for v in statistics]
    averaged = context.all_reduce(tf.distribute.ReduceOp.MEAN, local)
    for variable, value in zip(statistics, averaged):
      variable.assign(value)

  return average


def make_train_function(model, optimizer, strategy, global_batch_size,
                        objective, step, jit_compile, check_labels=None,
                        **recipe):
  """Returns train(iterator, num_steps) -> dict of scalars.

  Batches are (images, labels) or decode.py's (images, labels, skipped): then
  `skipped_records` sums the records the input skipped. `check_labels`:
  labels -> labels, run on each replica before its step, for an input that
  cannot check them itself (DALI's). `recipe`: the keyword arguments of
  replica_train_step after jit_compile.

  `step` counts every step taken, including those LossScaleOptimizer skips
  for non-finite gradients; `optimizer.iterations` counts applied updates,
  so their difference is the number of skipped steps.
  """
  optimizers.take_summed_gradients(optimizer)
  replica_step = replica_train_step(
      model, optimizer, global_batch_size, objective, jit_compile,
      replicas=strategy.num_replicas_in_sync, **recipe)
  average_batch_norm_statistics = batch_norm_averager(model,
                                                      recipe.get('ema'))

  @tf.function
  def train(iterator, num_steps):
    loss_sum = tf.constant(0.0)
    correct_sum = tf.constant(0.0)
    grad_norm_sum = tf.constant(0.0)
    finite_norms = tf.constant(0.0)
    wait_s = tf.constant(0.0, tf.float64)
    skipped_sum = tf.constant(0)
    # Each step's loss: curves with points between executions.
    step_losses = tf.TensorArray(tf.float32, size=num_steps)
    for index in tf.range(num_steps):
      # Stateful ops run in program order, so this brackets the fetch alone.
      start = tf.timestamp()
      batch = next(iterator)
      with tf.control_dependencies(tf.nest.flatten(
          strategy.experimental_local_results(batch))):
        wait_s += tf.timestamp() - start
      images, labels = batch[:2]
      if check_labels:
        labels = strategy.run(check_labels, args=(labels,))
      loss, correct, grad_norm = strategy.run(replica_step,
                                              args=(images, labels))
      loss = strategy.reduce(SUM, loss, axis=None)
      # Every replica holds the same summed gradient, so the same norm;
      # a float16 step that overflowed (its update skipped) is left out.
      grad_norm = strategy.reduce(MEAN, grad_norm, axis=None)
      finite = tf.math.is_finite(grad_norm)
      grad_norm_sum += tf.where(finite, grad_norm, 0.0)
      finite_norms += tf.cast(finite, tf.float32)
      step_losses = step_losses.write(index, loss)
      loss_sum += loss
      correct_sum += strategy.reduce(SUM, correct, axis=None)
      if len(batch) > 2:  # Records the input skipped (decode.py).
        skipped_sum += strategy.reduce(
            SUM, strategy.run(tf.reduce_sum, args=batch[2:]), axis=None)
      step.assign_add(1)
    if strategy.num_replicas_in_sync > 1 and average_batch_norm_statistics:
      strategy.run(average_batch_norm_statistics)
    steps = tf.cast(num_steps, tf.float32)
    return {'loss': loss_sum / steps,
            'accuracy': correct_sum / (steps * global_batch_size),
            'grad_norm': tf.where(finite_norms > 0, grad_norm_sum /
                                  tf.maximum(finite_norms, 1.0), math.inf),
            'input_wait_s': wait_s, 'skipped_records': skipped_sum,
            'step_losses': step_losses.stack()}

  return train


def _value(variable):
  """A Keras variable's tf.Variable; a tf.Variable (an average) itself."""
  return variable.value if isinstance(variable, keras.Variable) else variable


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
  """One replica's eval batch: objective_lib.eval_sums of its logits."""

  @tf.autograph.experimental.do_not_convert  # As replica_train_step's.
  def replica_step(images, labels, weights):
    logits = model(images, training=False)
    return objective_lib.eval_sums(logits, labels, weights, num_classes)

  return replica_step


def make_eval_function(model, strategy, num_classes, check_labels=None,
                       weights_at=None):
  """Returns evaluate(iterator, num_steps) -> loss, accuracy, top-5 accuracy,
  examples and the confusion matrix (rows: true class, columns: predicted).

  Batches are (images, labels, weights), or (images, labels) with
  `weights_at(batch index, replica id)` giving each replica's weights and
  `check_labels` checking its labels (DALI's input: see make_train_function).
  """
  replica_step = replica_eval_step(model, num_classes)

  def completed(index):
    def complete(images, labels):
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      return images, check_labels(labels), weights_at(index, replica)
    return complete

  @tf.function
  def evaluate(iterator, num_steps):
    totals = tf.zeros(4)
    confusion = tf.zeros((num_classes, num_classes))
    for index in tf.range(num_steps):
      batch = next(iterator)
      if weights_at:
        batch = strategy.run(completed(index), args=batch)
      sums, matrix = strategy.run(replica_step, args=batch)
      totals += strategy.reduce(SUM, sums, axis=None)
      confusion += strategy.reduce(SUM, matrix, axis=None)
    loss, correct, correct_top_k, examples = tf.unstack(totals)
    return {'loss': loss / examples, 'accuracy': correct / examples,
            'top5_accuracy': correct_top_k / examples, 'examples': examples,
            'confusion': confusion}

  return evaluate
