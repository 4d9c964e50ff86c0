"""A TPU runs every step as one XLA program; these steps must lower to it.

No TPU here, so this is a proxy: each replica function (the train step with
its optimizer update, the eval step, the batch-norm averaging) is lowered
with XLA on the CPU, for float32 and mixed_bfloat16, to HLO. An op with no
XLA kernel or a shape XLA cannot make static fails here. The TPU's op set
is not the CPU's (BUILD_NOTES.md): passing is necessary, not sufficient.
"""

import keras
import pytest
import tensorflow as tf

from pipeline.recipe import models
from pipeline.recipe import objective
from conftest import xla_on_cpu
from pipeline.backends.tensorflow import steps

NUM_CLASSES, SIZE, BATCH = 10, 32, 4


pytestmark = pytest.mark.skipif(
    not xla_on_cpu(), reason='this TensorFlow build has no XLA CPU backend '
    '(tensorflow-tpu); the main environment runs the check')


# Both policies: B0's layers (depthwise and squeeze-excite blocks) at a
# fraction of its size lower in seconds.
@pytest.fixture(params=['float32', 'mixed_bfloat16'])
def model_and_optimizer(request):
  keras.mixed_precision.set_global_policy(request.param)
  try:
    model = models.build_model('efficientnet_tiny', NUM_CLASSES, SIZE, 0.2,
                               0.9)
    optimizer = keras.optimizers.AdamW(1e-3)
    optimizer.build(model.trainable_variables)
    yield model, optimizer
  finally:
    keras.mixed_precision.set_global_policy('float32')


def _hlo(function, *args):
  return tf.function(function, jit_compile=True).experimental_get_compiler_ir(
      *args)(stage='hlo')


def test_replica_steps_lower_to_xla(model_and_optimizer):
  model, optimizer = model_and_optimizer
  images = tf.zeros((BATCH, SIZE, SIZE, 3), tf.uint8)
  labels = tf.zeros((BATCH,), tf.int32)
  train_step = steps.replica_train_step(
      model, optimizer, BATCH, objective.Objective(NUM_CLASSES, 0.1),
      jit_compile=True)
  train_hlo = _hlo(train_step.python_function, images, labels)
  eval_hlo = _hlo(steps.replica_eval_step(model, NUM_CLASSES), images, labels,
                  tf.ones((BATCH,)))
  average_hlo = _hlo(steps.batch_norm_averager(model))
  for hlo in (train_hlo, eval_hlo, average_hlo):
    assert hlo.startswith('HloModule')
  # The update is inside the program, not left to the host.
  assert 'convolution' in train_hlo and train_hlo.count('parameter(') > 300
  assert 'convolution' in eval_hlo


def test_a_host_only_op_fails_the_check():
  """The check can fail: a string op has no XLA kernel."""
  def step(images):
    tf.print(tf.strings.as_string(tf.reduce_sum(images)))
    return images

  with pytest.raises(Exception, match='(?i)xla|compil|kernel|support'):
    _hlo(step, tf.zeros((2, 2)))
