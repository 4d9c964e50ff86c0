"""NVIDIA DALI input (--config.input_pipeline=dali): JPEGs decoded on the GPU.

One host's cores decode about what one H100 trains (BUILD_NOTES.md, "Input
pipeline"), so NVIDIA's own references feed GPUs with DALI: nvJPEG, and the
hardware JPEG decoder of A100 and H100 (device='mixed'). Without a GPU the
same pipeline decodes on the CPU.

It reads the TFRecord files tf.data reads, through an index per file
(index.py), with tf.data's preprocessing (each augmentation's parts,
augmentations/: the inception crop decoded alone, flips, DALI's own
RandAugment, translations), evaluation's central crop, and label_offset;
the records split into shards (one per host, or per GPU), each read by its
own pipeline only, in a different order each epoch (a shuffle buffer).

DALI cannot skip a record it cannot decode (a batch is decoded whole:
NVIDIA/DALI#3913): the run stops in one line naming the record, found by one
pass of tf.data over the files (failure_message). Pipelines here import no
framework; each backend's DALI plugin runs them (Backend.distribute).
"""

import dataclasses
import importlib.util
import re
from typing import Optional

from absl import logging

from pipeline.data import augmentations
from pipeline.data.dali import index as dali_index
from pipeline.data import sources
from pipeline.errors import UserError

INSTALL = ('pip install -r requirements-gpu.txt (it pins DALI for CUDA 12, '
           'nvidia-dali-cuda120)')
# A record DALI cannot read as an image: its decoders or the shape probe.
_FAILED = re.compile(r'Error in (?:CPU|GPU|MIXED) operator `nvidia\.dali\.fn\.'
                     r'(?:decoders\.\w+|peek_image_shape)`.*?encountered:\s*'
                     r'(\S[^\n]*)', re.S)


def installed():
  try:
    return importlib.util.find_spec('nvidia.dali') is not None
  except ModuleNotFoundError:  # No nvidia package at all.
    return False


def refusal(spec, source):
  """Why DALI cannot run the input of `spec` (an InputSpec) on its loaded
  `source`, or ''."""
  if not source.record_files:
    return ('DALI reads TFRecord files: --config.dataset=tfrecord (write '
            'them with launch.make_tfrecords)')
  if spec.mixup_alpha or spec.cutmix_alpha:
    return ('mixup and CutMix run in tf.data: set --config.mixup_alpha=0 '
            '--config.cutmix_alpha=0, or --config.input_pipeline=tf.data')
  if spec.data_service:
    return 'a tf.data service runs tf.data: --config.input_pipeline=tf.data'
  if spec.eval_image_size != spec.image_size:
    return (f'its pipelines evaluate at the training size, not '
            f'eval_image_size={spec.eval_image_size}: set '
            f'--config.eval_image_size={spec.image_size}, or '
            '--config.input_pipeline=tf.data')
  if spec.augmentation.autoaugment:
    return ('AutoAugment (augment=inception_autoaugment) runs in tf.data: '
            '--config.input_pipeline=tf.data, or augment='
            'inception_randaugment')
  if spec.staged:
    return ('progressive learning rebuilds the input at each stage\'s size, '
            'which tf.data does: --config.input_pipeline=tf.data')
  magnitude = spec.randaugment.magnitude
  if spec.augmentation.randaugment and magnitude != int(magnitude):
    return (f'its RandAugment takes whole magnitudes, not '
            f'randaugment_magnitude={magnitude:g}: round it, or '
            '--config.input_pipeline=tf.data')
  gcs = [p for p in source.all_record_files() if p.startswith('gs://')]
  if gcs:
    return (f'DALI reads local files, not {gcs[0]}: copy them to a local '
            'disk (gcloud storage cp), or --config.input_pipeline=tf.data')
  return ''


def check(spec, source):
  """One line where DALI cannot run `spec`'s input on its loaded `source`."""
  if not installed():
    raise UserError(f'--config.input_pipeline=dali: DALI is not installed; '
                    f'{INSTALL}')
  why = refusal(spec, source)
  if why:
    raise UserError(f'--config.input_pipeline=dali: {why}')


# The reader's name, by which an iterator learns each shard's size.
READER = 'reader'


@dataclasses.dataclass(frozen=True)
class Input:
  """One split's DALI pipelines: `pipeline(shard, shards, device_id)`
  builds the one for a shard; `device_id` None decodes on the CPU."""
  files: tuple
  indices: tuple
  training: bool
  global_batch_size: int
  num_examples: int
  image_size: int
  num_classes: int
  label_offset: int
  augmentation: augmentations.Augmentation
  randaugment: augmentations.RandAugment
  central_fraction: float
  shuffle_buffer: int
  seed: Optional[int]
  num_threads: int  # The host's cores, shared by its pipelines.
  prefetch_depth: int = 2  # Batches each pipeline decodes ahead.

  def pipeline(self, shard_id, num_shards, device_id, local_pipelines=1):
    """The pipeline of one shard; `local_pipelines`: how many this host
    runs at once (one per GPU), which share its cores."""
    from nvidia.dali import pipeline_def  # pylint: disable=g-import-not-at-top
    build = pipeline_def(self._graph, enable_conditionals=True)
    return build(shard_id, num_shards, device_id is not None,
                 batch_size=self.global_batch_size // num_shards,
                 num_threads=self.threads(local_pipelines),
                 device_id=device_id,
                 seed=None if self.seed is None else self.seed + shard_id,
                 prefetch_queue_depth=self.prefetch_depth)

  def threads(self, local_pipelines):
    """Worker threads of each of `local_pipelines`: the cores split between
    them (each taking every core would oversubscribe them)."""
    return max(self.num_threads // max(local_pipelines, 1), 1)

  def shard_size(self, shard_id, num_shards):
    return shard_size(self.num_examples, shard_id, num_shards)

  def _graph(self, shard_id, num_shards, on_gpu):
    from nvidia.dali import fn  # pylint: disable=g-import-not-at-top
    from nvidia.dali import types  # pylint: disable=g-import-not-at-top
    from nvidia.dali import tfrecord  # pylint: disable=g-import-not-at-top
    records = fn.readers.tfrecord(
        path=list(self.files), index_path=list(self.indices), features={
            'image/encoded': tfrecord.FixedLenFeature((), tfrecord.string, ''),
            'image/class/label': tfrecord.FixedLenFeature(
                [1], tfrecord.int64, -1)},
        shard_id=shard_id, num_shards=num_shards, stick_to_shard=True,
        random_shuffle=self.training, initial_fill=max(min(
            self.shuffle_buffer, self.shard_size(shard_id, num_shards)), 1),
        name=READER)
    encoded = records['image/encoded']
    label = fn.reshape(fn.cast(records['image/class/label'],
                               dtype=types.INT32), shape=[])
    label = label - self.label_offset
    device = 'mixed' if on_gpu else 'cpu'
    image = (self._train_image(encoded, device) if self.training
             else self._eval_image(encoded, device))
    return image, label.gpu() if on_gpu else label

  def _train_image(self, encoded, device):
    from nvidia.dali import fn  # pylint: disable=g-import-not-at-top
    from nvidia.dali import types  # pylint: disable=g-import-not-at-top
    size, augmentation = self.image_size, self.augmentation
    if augmentation.inception_crop:
      image = fn.decoders.image_random_crop(
          encoded, device=device, output_type=types.RGB,
          random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
          num_attempts=10)
      image = fn.resize(image, resize_x=size, resize_y=size)
    else:
      image = self._central_square(encoded, device, 1.0)
    if augmentation.translates:  # Zero-padded by size // 8, then cut.
      pad = max(size // 8, 1)
      image = fn.slice(image, fn.random.uniform(
          range=[-pad, pad + 1], dtype=types.INT32, shape=[2]),
                       [size, size], axis_names='WH',
                       out_of_bounds_policy='pad', fill_values=0)
    if augmentation.flips:
      image = fn.flip(image, horizontal=fn.random.coin_flip())
    if augmentation.randaugment:
      from nvidia.dali.auto_aug import rand_augment  # pylint: disable=g-import-not-at-top
      # DALI's magnitude bins are the paper's scale, one a step.
      image = rand_augment.rand_augment(
          image, n=self.randaugment.layers,
          m=int(self.randaugment.magnitude),
          num_magnitude_bins=augmentations.MAX_MAGNITUDE + 1)
    return image

  def _eval_image(self, encoded, device):
    return self._central_square(encoded, device, self.central_fraction)

  def _central_square(self, encoded, device, fraction):
    """decode.central_window's square of `fraction` of the shorter side,
    resized (bilinear) to image_size."""
    from nvidia.dali import fn  # pylint: disable=g-import-not-at-top
    from nvidia.dali import types  # pylint: disable=g-import-not-at-top
    shape = fn.cast(fn.peek_image_shape(encoded), dtype=types.FLOAT)
    side = fn.cast(fn.cast(fraction * fn.reductions.min(shape[0:2]),
                           dtype=types.INT32), dtype=types.FLOAT)
    image = fn.decoders.image_crop(
        encoded, device=device, output_type=types.RGB, crop_h=side,
        crop_w=side, crop_pos_x=0.5, crop_pos_y=0.5)
    return fn.resize(image, resize_x=self.image_size,
                     resize_y=self.image_size, interp_type=types.INTERP_LINEAR)


def shard_size(num_examples, shard_id, num_shards):
  """Examples in a shard, as DALI's readers split them."""
  return ((shard_id + 1) * num_examples // num_shards
          - shard_id * num_examples // num_shards)


# What one pipeline's decoded batches ahead may take of host or GPU memory.
_PREFETCH_BYTES = 2 << 30


def train_input(spec, source, global_batch_size, staging_dir,
                steps_per_execution=1, num_shards=1):
  """The training split's Input, of the loaded `source`'s TFRecord files,
  prepared as the InputSpec `spec` says: each of `num_shards` pipelines
  decodes one execution ahead (the trainer takes a whole execution's
  batches at once) where _PREFETCH_BYTES holds it, 2 batches at least."""
  per_shard_bytes = (global_batch_size // num_shards) * spec.image_size**2 * 3
  depth = max(2, min(steps_per_execution, _PREFETCH_BYTES // per_shard_bytes))
  return _input(spec, source, global_batch_size, staging_dir, True, depth)


def eval_input(spec, source, global_batch_size, staging_dir):
  return _input(spec, source, global_batch_size, staging_dir, False)


def _input(spec, source, global_batch_size, staging_dir, training,
           prefetch_depth=2):
  files = source.record_files['train' if training else 'eval']
  return Input(
      files=files, indices=tuple(dali_index.indices(files, staging_dir)),
      training=training, global_batch_size=global_batch_size,
      num_examples=(source.num_train_examples if training
                    else source.num_eval_examples),
      image_size=spec.image_size, num_classes=source.num_classes,
      label_offset=source.label_offset, augmentation=spec.augmentation,
      randaugment=spec.randaugment,
      central_fraction=spec.central_fraction,
      shuffle_buffer=spec.shuffle_buffer, seed=spec.shuffle_seed,
      num_threads=dali_index.cpu_threads(), prefetch_depth=prefetch_depth)


def throughput(dali_input, batches, on_gpu):
  """Images/s of one pipeline over the whole batch (the GPU's first, or
  the CPU's), after a first batch that starts its threads."""
  import time  # pylint: disable=g-import-not-at-top
  pipeline = dali_input.pipeline(0, 1, 0 if on_gpu else None)
  pipeline.build()
  pipeline.run()
  start = time.perf_counter()
  for _ in range(batches):
    pipeline.run()
  return batches * dali_input.global_batch_size / (time.perf_counter() - start)


def check_labels(labels, num_classes, label_offset, files):
  """One-line UserError for a label outside [0, num_classes) (numpy)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  labels = np.asarray(labels)
  bad = labels[(labels < 0) | (labels >= num_classes)]
  if bad.size:
    raise UserError(
        f'label {int(bad[0])} (after label_offset={label_offset}) in a record '
        f'of {files_named(files)} is outside [0, {num_classes}); check '
        '--config.num_classes and --config.label_offset')


def failure_message(error, files):
  """The one-line message for DALI failing to decode a record of `files`,
  or None for other errors."""
  found = _FAILED.search(str(error))
  if not found:
    return None
  cause = found.group(1).strip()
  logging.info('DALI could not decode a record (%s); finding it with '
               'tf.data in %d file(s)', cause, len(files))
  where = dali_index.first_undecodable(files)
  return ('DALI cannot decode '
          + (f'record {where[1]} of {where[0]}' if where else
             f'a record of {files_named(files)} that tf.data decodes')
          + f' ({cause}) and cannot skip one; remove it, or train with '
          '--config.input_pipeline=tf.data, which skips and counts such '
          'records')


def files_named(files):
  return files[0] + (f' (or {len(files) - 1} other file(s))'
                     if len(files) > 1 else '')
