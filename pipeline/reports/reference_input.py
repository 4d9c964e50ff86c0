"""tensorflow/tpu's ImageNet training input: the baseline launch.benchmark
measures this pipeline's input against, on the same files."""

import tensorflow as tf

from pipeline.data.sources.tfrecord import records as tfrecords


def dataset(files, image_size, batch_size):
  """tensorflow/tpu's ImageNet training input, the baseline for ours.

  As in models/official/efficientnet (imagenet_input.py, preprocessing.py):
  files read by a 64-way interleave, a 1024-record shuffle, the random crop
  sampled on extract_jpeg_shape and decoded alone by decode_and_crop_jpeg
  (the central 87.5% if no box is found), resized (bilinear here; the
  reference defaults to bicubic), flipped, batched; its tf.data options.
  Written apart from pipeline/data/inputs.py on purpose: it is what ours is
  measured against.
  """
  def fetch(filename):
    return tf.data.TFRecordDataset(filename, buffer_size=8 * 1024 * 1024)

  def center_crop(image_bytes):
    shape = tf.image.extract_jpeg_shape(image_bytes)
    padded = tf.cast(image_size / (image_size + round(image_size / 7)) *
                     tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                     tf.int32)
    window = tf.stack([(shape[0] - padded + 1) // 2,
                       (shape[1] - padded + 1) // 2, padded, padded])
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    return tf.image.resize([image], [image_size, image_size])[0]

  def parse(record):
    image_bytes, label = tfrecords.parse(record)
    shape = tf.image.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
    bad = tf.reduce_sum(tf.cast(tf.equal(shape, tf.shape(image)),
                                tf.int32)) >= 3
    image = tf.cond(bad, lambda: center_crop(image_bytes),
                    lambda: tf.image.resize([image],
                                            [image_size, image_size])[0])
    image = tf.image.random_flip_left_right(image)
    image = tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)
    return tf.reshape(image, [image_size, image_size, 3]), label

  dataset = tf.data.Dataset.from_tensor_slices(files).repeat()
  dataset = dataset.interleave(fetch, cycle_length=64, num_parallel_calls=64,
                               deterministic=False).shuffle(1024)
  # ignore_errors: the reference would stop at a bad record.
  dataset = dataset.map(parse, 64).ignore_errors().batch(
      batch_size, True).prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.deterministic = False
  options.threading.max_intra_op_parallelism = 1
  options.threading.private_threadpool_size = 48
  return dataset.with_options(options)
