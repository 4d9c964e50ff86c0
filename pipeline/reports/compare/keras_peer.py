"""The code a Keras user would write for a folder of photographs: the peer
launch.compare --against=keras races.

As Keras' image-classification examples write it (keras.io, "Image
classification via fine-tuning with EfficientNet", from scratch):
`keras.utils.image_dataset_from_directory` at 224 px in batches of 32, a
random flip and rotation as layers, `keras.applications.EfficientNetB0(
weights=None)` with its own top, Adam, `model.fit`, evaluated each epoch on
the held-out folder. Run as its own process:

  python -m pipeline.reports.compare.keras_peer TRAIN_DIR EVAL_DIR EPOCHS \
      IMAGE_SIZE OUTPUT.json

It writes OUTPUT.json after every epoch: [[wall time, epoch, accuracy]].
"""

import json
import os
import sys
import time


def main(train_dir, eval_dir, epochs, image_size, output):
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  size = (int(image_size), int(image_size))
  train = keras.utils.image_dataset_from_directory(
      train_dir, image_size=size, batch_size=32, label_mode='categorical')
  evaluation = keras.utils.image_dataset_from_directory(
      eval_dir, image_size=size, batch_size=32, label_mode='categorical',
      shuffle=False)
  num_classes = len(train.class_names)
  augment = keras.Sequential([keras.layers.RandomFlip('horizontal'),
                              keras.layers.RandomRotation(0.15)])
  train = train.map(lambda images, labels: (augment(images), labels),
                    num_parallel_calls=tf.data.AUTOTUNE).prefetch(
                        tf.data.AUTOTUNE)
  model = keras.applications.EfficientNetB0(
      weights=None, classes=num_classes, input_shape=(*size, 3))
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss='categorical_crossentropy', metrics=['accuracy'])
  curve = []

  def record(epoch, logs):
    curve.append([time.time(), epoch + 1, float(logs['val_accuracy'])])
    temporary = f'{output}.tmp'
    with open(temporary, 'w') as f:
      json.dump(curve, f)
    os.replace(temporary, output)

  model.fit(train, epochs=int(epochs), validation_data=evaluation, verbose=2,
            callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=record)])


if __name__ == '__main__':
  main(*sys.argv[1:])
