"""Keras' own `model.fit` on a run's plan: the peer launch.compare
--keras_fit sets beside each policy's run, so "16 bits at float32's
accuracy, faster" and "faster than Keras' own loop" are read in one table.

Everything the run itself would take but the loop and the layer forms: the
same input (the plan's tf.data batches, as a global batch Keras
distributes), keras.applications' network with the run's head, its
optimizer and learning-rate schedule, loss, policy, steps per execution
and XLA setting, under the run's strategy. What differs is Keras' Trainer
(`model.fit`, its loss scaling under float16) and keras.applications' own
layers. Writes metrics.json with the keys the comparison's table reads.
"""

import contextlib
import time

import keras
import tensorflow as tf

from pipeline.data import inputs
from pipeline.recipe import layers
from pipeline.recipe import models
from pipeline.recipe import optimizers
from pipeline.rules.speed import precision
from pipeline.rules.config import validation


class _Timer(keras.callbacks.Callback):
  """The steady rate: images from the end of the first execution (which
  compiles) to the end of training."""

  def __init__(self, images_per_step, steps_per_execution):
    super().__init__()
    self.images_per_step = images_per_step
    self.steps_per_execution = steps_per_execution
    self.began = self.first_done = None
    self.steps_after_first = 0

  def on_train_begin(self, logs=None):
    self.began = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    if self.first_done is None:
      self.first_done = time.perf_counter()
    else:
      self.steps_after_first += self.steps_per_execution

  def rates(self):
    ended = time.perf_counter()
    seconds = ended - (self.first_done or ended)
    return ((self.first_done or ended) - self.began,
            self.steps_after_first * self.images_per_step / seconds
            if seconds > 0 and self.steps_after_first else None)


def train(plan, forms=False):
  """Trains and evaluates Keras' fit on `plan` (with this project's layer
  forms where `forms`); the metrics.json dict."""
  config, source = plan.recipe, plan.source
  began = time.perf_counter()
  keras.mixed_precision.set_global_policy(precision.keras_policy(plan.policy))
  keras.utils.set_random_seed(config.seed)
  classes = source.num_classes
  sizes = plan.image_sizes
  targets = lambda labels: (labels if labels.shape.rank == 2 else
                            tf.one_hot(labels, classes))  # Mixing: soft.
  # The global batch, one pipeline: Keras distributes it.
  train_batches = inputs.train_input_fn(
      plan.input, source, plan.global_batch_size, plan.cache_kind)(
          tf.distribute.InputContext()).map(
              lambda images, labels, skipped: (images, targets(labels)))
  eval_batches = inputs.eval_input_fn(
      plan.input, source, plan.global_batch_size, plan.cache_kind)(
          tf.distribute.InputContext()).map(
              lambda images, labels, weights: (images, targets(labels),
                                               weights))
  # A tf.distribute strategy's scope; JAX's mesh has none (Keras' JAX
  # trainer places the variables itself).
  scope = getattr(getattr(plan.hardware, 'strategy', None), 'scope', None)
  with scope() if scope else contextlib.nullcontext():
    model = models.build_model(
        config.model, classes, sizes.train if sizes.train == sizes.eval
        else None, config.dropout_rate, config.batch_norm_momentum,
        config.drop_connect_rate, forms={
            table.key: config[table.key] for table in layers.FORM_TABLES}
        if forms else None)
    model.compile(
        optimizer=optimizers.make_optimizer(
            config, plan.peak_learning_rate, plan.total_steps,
            plan.steps_per_epoch),
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=config.label_smoothing),
        metrics=['accuracy'], steps_per_execution=plan.steps_per_execution,
        jit_compile=bool(plan.xla))
  timer = _Timer(plan.global_batch_size, plan.steps_per_execution)
  model.fit(train_batches, epochs=config.epochs,
            steps_per_epoch=plan.steps_per_epoch, callbacks=[timer],
            shuffle=False, verbose=0)  # The input shuffles, as the run's.
  compile_s, images_per_sec = timer.rates()
  evaluated = model.evaluate(
      eval_batches, steps=inputs.eval_steps(source, plan.global_batch_size),
      return_dict=True, verbose=0)
  return {
      'trainer': 'keras_fit', 'layer_forms': forms,
      'backend': plan.backend.name,
      'policy': plan.policy, 'model': config.model,
      'dataset': source.name, 'image_size': sizes.train,
      'global_batch_size': plan.global_batch_size,
      'steps_per_execution': plan.steps_per_execution,
      'total_steps': plan.total_steps, 'compile_s': compile_s,
      'train_images_per_sec': images_per_sec,
      validation.Metric.EVAL_ACCURACY: evaluated['accuracy'],
      validation.Metric.EVAL_LOSS: evaluated['loss'],
      'seed': config.seed, 'epochs': config.epochs,
      'steps_per_epoch': plan.steps_per_epoch,
      'examples_per_epoch': plan.examples_per_epoch,
      'wall_s': time.perf_counter() - began,
  }
