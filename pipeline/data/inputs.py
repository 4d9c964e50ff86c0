"""The input of a run: tf.data built per worker from a source's records
(sources/), or DALI's pipelines (dali/); train_input and eval_input give
either (a TfDataInput, a dali.Input), which the run's backend distributes (the loop hands it
over: data/ calls no backend).

One pipeline serves every source. Each record is decoded to just the window
the model sees (a JPEG's crop window alone), skipped and counted if it
cannot be (decode.py). What is cached (cache.py): decoded images, augmented after
the cache every epoch (augmenting before it would freeze the first epoch's
crops); or the encoded records, decoded and cropped every epoch; or nothing.
Then batch and prefetch. Images stay uint8 until they reach the device,
where the model casts them. What they take of the config is an InputSpec
(input_spec.py, the plan's `input`); every input function takes a
tf.distribute.InputContext, and batches are per replica.
"""

import dataclasses
from typing import Callable

import tensorflow as tf

from pipeline.data.augmentations import tf_data as augment
from pipeline.data import cache as cache_lib
from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.data import data_service
from pipeline.data import decode

AUTOTUNE = tf.data.AUTOTUNE
# Every function an input maps is traced as written, not converted by
# autograph: none branches or loops in Python on a tensor (tf.cond and
# tf.data's own operations do), and converting them cost each run's start
# about 2.5 s here. tf.data takes the setting from where map() is called.
_not_converted = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True)
class TfDataInput:
  """A run's batches from tf.data, for its backend to distribute
  (Backend.distribute): an input function of a tf.distribute.InputContext.
  DALI's are the other kind of input, a dali.Input."""
  input_fn: Callable


def train_input(plan, service_job='train', spec=None):
  """The plan's training batches, as its backend takes them to distribute:
  a TfDataInput or a dali.Input. `spec`: the InputSpec of a stage of
  progressive learning (default: the plan's)."""
  spec = spec or plan.input
  if plan.input_pipeline is input_pipeline_lib.Pipeline.DALI:
    return dali.train_input(spec, plan.source, plan.global_batch_size,
                            plan.staging_dir, plan.steps_per_execution,
                            plan.hardware.num_replicas)
  return TfDataInput(train_input_fn(spec, plan.source,
                                    plan.global_batch_size, plan.cache_kind,
                                    service_job))


def eval_input(plan):
  """The plan's evaluation batches (eval_steps of them), as its backend
  takes them to distribute."""
  if plan.input_pipeline is input_pipeline_lib.Pipeline.DALI:
    return dali.eval_input(plan.input, plan.source, plan.global_batch_size,
                           plan.staging_dir)
  return TfDataInput(eval_input_fn(plan.input, plan.source,
                                   plan.global_batch_size, plan.cache_kind))


def train_input_fn(spec, source, global_batch_size, cache=None,
                   service_job='train'):
  """An input function for strategy.distribute_datasets_from_function:
  batches of (uint8 images, int32 labels, int32 records skipped before each);
  with mixup or CutMix, float32 soft labels [batch, classes] instead.

  `spec`: an InputSpec. `cache`: the cache.Kind (default: as cache.choose
  picks for `spec`). A decoded cache holds whole images and augments after
  it; otherwise the shuffled records are decoded with their random crop
  each epoch. With spec.data_service, the service's workers run it all as
  `service_job`.
  """
  cache = cache or cache_lib.choose(spec, source)[0]

  @_not_converted
  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    records = source.read('train', input_context, True, spec.shuffle_seed)
    if cache is cache_lib.Kind.DECODED:
      dataset = _cached_then_augmented(records, spec, source, input_context)
    else:
      dataset = _augmented_as_decoded(records, spec, source, input_context,
                                      cache is cache_lib.Kind.ENCODED)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if spec.mixes:
      mix = augment.mixer(spec.mixup_alpha, spec.cutmix_alpha,
                          source.num_classes, spec.image_size)
      # Seeded by the run's seed, the pipeline and the batch's index.
      stream = spec.seed * 1024 + input_context.input_pipeline_id
      dataset = dataset.enumerate().map(
          lambda index, batch: mix(batch, tf.stack(
              [tf.constant(stream, tf.int64), index])),
          num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = spec.deterministic
    dataset = dataset.with_options(options)
    if spec.data_service:
      dataset = data_service.distribute(dataset, spec.data_service,
                                        service_job)
    return dataset.prefetch(AUTOTUNE)

  return input_fn


def _cached_then_augmented(records, spec, source, input_context):
  """Decoded once into the cache, then augmented every epoch. Inception
  crops need the whole image (aspect kept); other images are final once
  decoded. Both passes read the one cache, whose records were skipped once.
  """
  size, seed, augmentation = spec.image_size, spec.shuffle_seed, (
      spec.augmentation)
  buffer = min(spec.shuffle_buffer, source.num_train_examples)
  window, shape_of, image_shape = (
      (decode.whole_window, decode.shorter_side(spec.cache_size),
       (None, None, 3))
      if augmentation.inception_crop else
      (decode.square_window, decode.square(size), (size, size, 3)))
  dataset = cache_lib.apply(decode.decoded_records(
      records, source.parse,
      lambda encoded: decode.decode_window(encoded, window, shape_of),
      image_shape, source.num_classes), spec, 'train', input_context)
  rest = dataset.map(decode.without_skips).shuffle(
      buffer, seed=None if seed is None else seed + 1).repeat()
  transform = augment.augmenter(augmentation, size, crop=True,
                                randaugment=spec.randaugment)
  return dataset.shuffle(buffer, seed=seed).concatenate(rest).map(
      lambda image, label, skipped: (transform(image), label, skipped),
      num_parallel_calls=AUTOTUNE)


def _augmented_as_decoded(records, spec, source, input_context,
                          cache_encoded):
  """The shuffled records (or their encoded cache) decoded each epoch with
  their random crop: one parallel stage decodes and augments."""
  size, augmentation = spec.image_size, spec.augmentation
  if cache_encoded:
    records = cache_lib.apply(records, spec, 'train', input_context)
  buffer = min(spec.shuffle_buffer, source.num_train_examples)
  records = records.shuffle(buffer, seed=spec.shuffle_seed).repeat()
  window = (decode.random_window if augmentation.inception_crop
            else decode.square_window)
  transform = augment.augmenter(augmentation, size, crop=False,
                                randaugment=spec.randaugment)
  return decode.decoded_records(
      records, source.parse,
      lambda encoded: transform(
          decode.decode_window(encoded, window, decode.square(size))),
      (size, size, 3), source.num_classes)


def eval_steps(source, global_batch_size):
  """Steps that cover every held-out example once (the last batch padded)."""
  return -(-source.num_eval_examples // global_batch_size)


def eval_input_fn(spec, source, global_batch_size, cache=None):
  """Held-out examples as (image, label, weight), padded to full batches.

  Each pipeline pads its shard with weight-0 examples to the same number of
  full batches, so every example counts exactly once while every batch keeps
  the static shape TPUs need. A decoded cache holds the final images.
  """
  cache = cache or cache_lib.choose(spec, source)[0]
  size, fraction = spec.eval_image_size, spec.central_fraction
  steps = eval_steps(source, global_batch_size)

  @_not_converted
  def input_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    per_pipeline = steps * global_batch_size // input_context.num_input_pipelines
    records = source.read('eval', input_context, False, None)
    if cache is cache_lib.Kind.ENCODED:
      records = cache_lib.apply(records, spec, 'eval', input_context)
    dataset = decode.decoded_records(
        records, source.parse,
        lambda encoded: decode.eval_image(encoded, size, fraction),
        (size, size, 3), source.num_classes)
    dataset = dataset.map(lambda image, label, skipped: (image, label, 1.0))
    padding = tf.data.Dataset.from_tensors(
        (tf.zeros((size, size, 3), tf.uint8), 0, 0.0)).repeat()
    dataset = dataset.concatenate(padding).take(per_pipeline)
    if cache is cache_lib.Kind.DECODED:
      dataset = cache_lib.apply(dataset, spec, 'eval', input_context)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)

  return input_fn
