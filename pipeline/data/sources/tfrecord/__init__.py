"""TFRecord files of encoded images and labels (ImageNet's as
tensorflow/tpu writes them, or launch.make_tfrecords'): each worker reads
its own files, 16 at a time, 8 MiB read buffers. records.py writes them;
photos.py makes the bundled photographs."""

from pipeline import parts
from pipeline.data.sources import detail as detail_lib
from pipeline.data.sources.source import DataSource
from pipeline.data.sources.source import NUM_CLASSES
from pipeline.data.sources.source import Source
from pipeline.errors import UserError


class TFRecordFiles(DataSource):
  """Globs of TFRecord files with image/encoded and image/class/label."""
  name = 'tfrecord'
  description = ('TFRecord files of encoded images and labels (globs, local '
                 'or gs://; a labels.txt beside them names the classes)')
  keys = {
      'train_files': parts.Key('glob of the training TFRecord files'),
      'eval_files': parts.Key('glob of the evaluation TFRecord files'),
      'num_classes': NUM_CLASSES,
      'label_offset': parts.Key('1 for ImageNet TFRecords, which count '
                                'from 1'),
      'num_train_examples': parts.Key('0: count the records once at start'),
      'num_eval_examples': parts.Key('0: count the records once at start'),
  }
  names_classes = True

  def inputs(self, settings):
    return {'train_files': settings.train_files,
            'eval_files': settings.eval_files}

  def held_out(self, settings):
    return settings.eval_files

  def load(self, settings, prepare=True):
    del prepare  # Files are read where they are.
    return _load(settings)


def _load(settings):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfrecord import records as tfrecords  # pylint: disable=g-import-not-at-top
  if settings.num_classes < 1:
    raise UserError('dataset=tfrecord needs --config.num_classes=N (N >= 1)')
  files = {'train': tuple(tfrecords.list_files(settings.train_files)),
           'eval': tuple(tfrecords.list_files(settings.eval_files))}
  sizes = {'train': settings.num_train_examples or
                    tfrecords.count_records(files['train']),
           'eval': settings.num_eval_examples or
                   tfrecords.count_records(files['eval'])}
  offset = settings.label_offset

  def read(split, input_context, shuffle, seed):
    names = list(files[split])  # A tuple would be a structure to tf.data.
    pipelines, index = (input_context.num_input_pipelines,
                        input_context.input_pipeline_id)
    by_file = len(names) >= pipelines
    if by_file:
      names = names[index::pipelines]
    dataset = tf.data.Dataset.from_tensor_slices(names)
    if shuffle:
      dataset = dataset.shuffle(len(names), seed=seed)

    def records_of(filename):
      # A record with corrupt framing ends its file: TF's reader cannot
      # resynchronise after it. Skip the rest rather than crash the run.
      # 8 MiB read buffers, as tensorflow/tpu reads ImageNet from GCS.
      return tf.data.Dataset.zip(
          tf.data.TFRecordDataset(filename, buffer_size=8 * 2**20)
          .ignore_errors(), tf.data.Dataset.from_tensors(filename).repeat())

    dataset = dataset.interleave(records_of, cycle_length=min(len(names), 16),
                                 num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=not shuffle or seed is not None)
    if not by_file:
      dataset = dataset.shard(pipelines, index)
    return dataset

  def parse(record, filename):
    encoded, label = tfrecords.parse(record)
    return encoded, label - offset, filename

  names = tfrecords.read_labels(settings.train_files)
  if names and len(names) != settings.num_classes:
    raise UserError(f'{tfrecords.LABELS_FILE} beside {settings.train_files!r}'
                    f' names {len(names)} classes, not num_classes='
                    f'{settings.num_classes}')
  def detail():
    # The first records of the first files: a read of a few MB.
    records = tf.data.TFRecordDataset(list(files['train'][:4])).ignore_errors()
    return detail_lib.of_encoded(
        (encoded for encoded, _ in records.take(detail_lib.SAMPLE).map(
            tfrecords.parse).as_numpy_iterator()),
        f'training records (the first of {settings.train_files})')

  return Source('tfrecord', settings.num_classes, sizes['train'], sizes['eval'],
                read, parse, class_names=names, encoded_bytes=sum(
                    tf.io.gfile.stat(name).length
                    for names in files.values() for name in names),
                record_files=files, label_offset=offset, detail=detail)

