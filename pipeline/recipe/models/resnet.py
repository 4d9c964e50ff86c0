"""ResNet-50 (keras.applications): the field's reference benchmark, which
users compare pipelines by on TPUs and GPUs. Its network expects Caffe's
input (BGR, the ImageNet mean subtracted, not scaled), as its published
weights were trained: a layer before it does that. It has no stochastic
depth."""

import keras
from keras import ops

from pipeline.recipe.models.family import ModelFamily

# keras.applications.resnet's preprocess_input ('caffe' mode): the mean
# of each channel, in BGR order.
CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)


@keras.saving.register_keras_serializable(package='pipeline')
class CaffeInput(keras.layers.Layer):
  """RGB pixels in [0, 255] to Caffe's input: BGR, the mean subtracted."""

  def call(self, inputs):
    return ops.flip(inputs, axis=-1) - ops.cast(
        ops.convert_to_tensor(CAFFE_MEAN_BGR), inputs.dtype)


class ResNet(ModelFamily):
  """ResNet-50 of keras.applications."""
  name = 'resnet'
  description = ('ResNet-50 (resnet50), the reference benchmark of TPUs and '
                 'GPUs; no stochastic depth')

  def names(self):
    return ('resnet50',)

  def image_sizes(self, name):
    return 224, 224, "the ResNet paper's ImageNet recipe"

  def headless(self, name, weights, input_shape):
    del name
    return keras.applications.ResNet50(
        include_top=False, weights=weights, pooling='avg',
        input_shape=input_shape)

  def with_its_top(self, name, num_classes, input_shape):
    return keras.applications.ResNet50(weights=None, classes=num_classes,
                                       input_shape=input_shape)

  def preprocessing(self, name):
    return CaffeInput(name='caffe_input')

  def published_file(self, name):
    return 'resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5'

