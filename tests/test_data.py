"""The input pipeline on real files: tfds digits, tfds mock data, TFRecords.

The TFRecord files are written here, in the Cloud TPU reference layout, with
real JPEG and PNG bytes, grayscale, RGBA and CMYK images, and broken records.
"""

import io
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps

from configs import default
from pipeline.data import augmentations
from pipeline.data import inputs
from pipeline.data import decode
from pipeline.data import cache
from pipeline.data import sources
from pipeline.data.sources.tfds_set import sklearn_digits
from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.errors import UserError
from pipeline.data.input_spec import InputSpec


def _config(**overrides):
  """The default config at what the plan resolves for the digits."""
  config = default.get_config()
  config.update(dict(image_size=32, augment='translate'), **overrides)
  return config


def _context(pipelines=1, index=0, replicas=None):
  return tf.distribute.InputContext(pipelines, index, replicas or pipelines)


def _encode(array, fmt, mode=None):
  buffer = io.BytesIO()
  Image.fromarray(array, mode=mode).save(buffer, format=fmt)
  return buffer.getvalue()


def _image(label, size=40, channels=3):
  """An image whose mean brightness encodes its label (survives JPEG)."""
  rng = np.random.RandomState(label)
  base = np.full((size, size + 8, channels), 20 * label + 30, np.uint8)
  return np.clip(base + rng.randint(0, 5, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope='module')
def tfrecord_dir(tmp_path_factory):
  """3 train files (24 good records, 2 bad) and 1 eval file, labels from 1."""
  root = tmp_path_factory.mktemp('tfrecords')
  good = 0
  for shard in range(3):
    records = []
    for i in range(8):
      label = (shard * 8 + i) % 10
      kind = i % 4
      if kind == 0:
        encoded = _encode(_image(label), 'JPEG')
      elif kind == 1:
        encoded = _encode(_image(label), 'PNG')
      elif kind == 2:  # Grayscale JPEG.
        encoded = _encode(_image(label, channels=1)[..., 0], 'JPEG')
      else:  # RGBA PNG.
        encoded = _encode(_image(label, channels=4), 'PNG')
      records.append(tfrecords.serialize(encoded, label + 1))
      good += 1
    if shard == 0:
      records.insert(3, tfrecords.serialize(b'not an image at all', 4))
    if shard == 1:
      truncated = _encode(_image(5, size=64), 'JPEG')[:200]
      records.insert(5, tfrecords.serialize(truncated, 6))
    tfrecords.write(str(root / f'train-{shard:05d}-of-00003'), records)
  cmyk = _encode(np.stack([_image(3)[..., 0]] * 4, -1), 'JPEG', mode='CMYK')
  eval_records = [tfrecords.serialize(_encode(_image(l), 'JPEG'), l + 1)
                  for l in range(10)] + [tfrecords.serialize(cmyk, 4)]
  tfrecords.write(str(root / 'eval-00000-of-00001'), eval_records)
  return root, good


def _tfrecord_config(root, **overrides):
  fields = dict(dataset='tfrecord', train_files=str(root / 'train-*'),
                eval_files=str(root / 'eval-*'), num_classes=10,
                label_offset=1, augment='none', cache='memory')
  return _config(**{**fields, **overrides})


def _decode_all(records, source, size=32):
  """(image, label, skipped) of every record, decoded as for eval."""
  return list(decode.decoded_records(
      records, source.parse, lambda encoded: decode.eval_image(encoded, size, 1.0),
      (size, size, 3), source.num_classes))


def _all_train_examples(config, source, pipelines=1, index=0):
  records = source.read('train', _context(pipelines, index), False, None)
  decoded = _decode_all(records, source, config.image_size)
  return ([(x.numpy(), int(y)) for x, y, _ in decoded],
          sum(int(s) for _, _, s in decoded))


# --- tensorflow-datasets ------------------------------------------------------


def test_digits_source_has_fixed_splits(tfds_dir):
  source = sources.load_source(_config(data_dir=tfds_dir))
  assert source.num_classes == 10
  assert (source.num_train_examples, source.num_eval_examples) == (1438, 359)


@pytest.mark.parametrize('name,canvas,largest', [
    ('scattered_digits', 64, 60), ('scattered_digits128', 128, 120)])
def test_scattered_digits_are_the_digits_at_many_sizes_and_places(
    tmp_path, name, canvas, largest):
  # The sets progressive learning's time to accuracy is measured on
  # offline: every digit three times, its test split the test digits only.
  source = sources.load_source(_config(dataset=name, data_dir=str(tmp_path)))
  assert source.num_classes == 10
  assert (source.num_train_examples, source.num_eval_examples) == (
      3 * 1438, 3 * 359)
  builder = tfds.builder(name, data_dir=str(tmp_path))
  assert builder.info.features['image'].shape == (canvas, canvas, 1)
  digits = sklearn_digits.splits()
  train_keys, test_keys = digits['train'][2], digits['test'][2]
  assert not set(train_keys) & set(test_keys)
  images = digits['test'][0][:40]
  scattered = sklearn_digits.scatter(images, 2, builder.CANVAS, builder.SIZES)
  assert scattered.shape == (120, canvas, canvas, 1)
  assert scattered.dtype == np.uint8
  extents = []
  for index, picture in enumerate(scattered[..., 0]):
    # The ink is the digit itself, scaled: taken back to the size of the
    # original's ink, it is the original.
    original = _inked(images[index % len(images)])
    window = _inked(picture)
    extents.append(max(window.shape))
    back = tf.image.resize(window[..., None].astype(np.float32),
                           original.shape, 'area')[..., 0].numpy()
    assert np.corrcoef(back.ravel(), original.ravel())[0, 1] > 0.8, index
  assert max(extents) <= largest
  # Many scales, down to digits that need the whole canvas's resolution.
  assert min(extents) < 20 and max(extents) > 0.75 * largest


def _inked(image):
  """The smallest window of `image` holding all its ink."""
  rows, columns = np.nonzero(image)
  return image[rows.min():rows.max() + 1, columns.min():columns.max() + 1]


def test_split_specs_select_slices(tfds_dir):
  source = sources.load_source(_config(data_dir=tfds_dir,
                                    train_split='train[:90%]',
                                    eval_split='train[90%:]'))
  assert source.num_train_examples + source.num_eval_examples == 1438


def test_tfds_mock_data_through_the_same_pipeline(tmp_path):
  config = _config(dataset='cifar10', data_dir=str(tmp_path), eval_split='test',
                   image_size=32, augment='translate_flip')
  with tfds.testing.mock_data(num_examples=24):
    source = sources.load_source(config)
    assert (source.num_classes, source.num_train_examples) == (10, 24)
    batch = next(iter(inputs.train_input_fn(InputSpec.of(config), source,
                                            8)(_context())))
  images, labels, skipped = batch
  assert images.dtype == tf.uint8 and images.shape == (8, 32, 32, 3)
  assert labels.dtype == tf.int32
  assert int(tf.reduce_sum(skipped)) == 0


def test_train_batches_are_uint8_per_replica(tfds_dir):
  config = _config(data_dir=tfds_dir)
  source = sources.load_source(config)
  fn = inputs.train_input_fn(InputSpec.of(config), source, 64)
  images, labels, _ = next(iter(fn(_context(1, 0, replicas=2))))
  assert images.dtype == tf.uint8 and images.shape == (32, 32, 32, 3)
  assert labels.dtype == tf.int32 and labels.shape == (32,)
  assert int(tf.reduce_max(images)) > 128  # Pixels use uint8's range.


@pytest.mark.parametrize('pipelines', [1, 2])
def test_eval_covers_every_example_once(tfds_dir, pipelines):
  config = _config(data_dir=tfds_dir)
  source = sources.load_source(config)
  fn = inputs.eval_input_fn(InputSpec.of(config), source, 64)
  seen = []
  for index in range(pipelines):
    for images, labels, weights in fn(_context(pipelines, index)):
      seen.extend(zip(images.numpy().reshape(len(labels), -1).sum(1).tolist(),
                      labels.numpy().tolist(), weights.numpy().tolist()))
  assert len(seen) == inputs.eval_steps(source, 64) * 64
  real = sorted((s, l) for s, l, w in seen if w == 1.0)
  assert len(real) == source.num_eval_examples == 359
  assert len(set(real)) > 350  # Distinct images, not one repeated.


def test_two_workers_read_disjoint_shards_covering_all(tfds_dir):
  """One tfds file, two workers: sharded by example, each example once."""
  config = _config(data_dir=tfds_dir, train_split='train[:200]')
  source = sources.load_source(config)
  shards = [_all_train_examples(config, source, 2, i)[0] for i in range(2)]
  keys = [{x.tobytes() for x, _ in shard} for shard in shards]
  assert keys[0].isdisjoint(keys[1])
  assert len(shards[0]) + len(shards[1]) == 200
  assert len(keys[0] | keys[1]) == 200


def test_unknown_dataset_is_a_user_error(tfds_dir):
  with pytest.raises(UserError, match=r"unknown dataset 'no_such_set'"):
    sources.load_source(_config(data_dir=tfds_dir, dataset='no_such_set'))


def test_missing_split_is_a_user_error(tfds_dir):
  with pytest.raises(UserError, match=r"split 'validation'"):
    sources.load_source(_config(data_dir=tfds_dir, eval_split='validation'))


@pytest.mark.parametrize('passes', [2, None], ids=['finite', 'endless'])
def test_records_that_cannot_be_decoded_are_counted_and_named(capfd, passes):
  """Each gap is named by the first record decoded after it: a lone bad
  record, two in a row, and a run longer than the names each record keeps;
  on the stream's next passes they are counted again, not named again. An
  endless stream (training uncached) takes another path: no end marker."""
  good = _encode(np.zeros((8, 8, 3), np.uint8), 'PNG')
  kinds = 'gbgbbg' + 'b' * 12 + 'g'
  records = tf.data.Dataset.from_tensor_slices((
      [good if kind == 'g' else b'not an image' for kind in kinds],
      [0] * len(kinds), [f'f{i}' for i in range(len(kinds))])).repeat(passes)
  decoded = decode.decoded_records(
      records, lambda encoded, label, origin: (encoded, label, origin),
      lambda encoded: tf.io.decode_png(encoded, 3), (8, 8, 3), 10)
  assert [int(s) for _, _, s in decoded.take(8).as_numpy_iterator()] == [
      0, 1, 2, 12] * 2
  named = [line for line in capfd.readouterr().err.splitlines()
           if line.startswith(decode.SKIPPED_LINE)]
  assert named == [decode.SKIPPED_LINE + names for names in (
      'f1', 'f3, f4', ', '.join(f'f{i}' for i in range(10, 18)) +
      ' and 4 more before them')]


# --- TFRecord files -------------------------------------------------------------


def test_tfrecords_decode_skip_and_count_bad_records(tfrecord_dir):
  root, good = tfrecord_dir
  config = _tfrecord_config(root)
  source = sources.load_source(config)
  assert source.num_train_examples == good + 2  # Records, before decoding.
  examples, skipped = _all_train_examples(config, source)
  assert skipped == 2  # The garbage bytes and the truncated JPEG.
  assert len(examples) == good
  for image, label in examples:
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert 0 <= label < 10  # label_offset=1 applied.
    # Brightness encodes the label, so image and label stayed together.
    assert abs(image.mean() - (20 * label + 32)) < 6, (image.mean(), label)


def test_grayscale_rgba_and_cmyk_become_rgb(tfrecord_dir):
  root, _ = tfrecord_dir
  config = _tfrecord_config(root)
  source = sources.load_source(config)
  records = source.read('eval', _context(), False, None)
  decoded = _decode_all(records, source)
  assert len(decoded) == 11  # The CMYK JPEG decodes too.
  for image, _, _ in decoded:
    assert image.shape == (32, 32, 3)


def test_two_workers_split_tfrecord_files(tfrecord_dir):
  root, good = tfrecord_dir
  config = _tfrecord_config(root)
  source = sources.load_source(config)
  shards = [_all_train_examples(config, source, 2, i) for i in range(2)]
  assert sum(len(s[0]) for s in shards) == good
  assert sum(s[1] for s in shards) == 2
  keys = [{x.tobytes() for x, _ in s[0]} for s in shards]
  assert keys[0].isdisjoint(keys[1])


def test_more_workers_than_files_shard_by_example(tfrecord_dir):
  root, _ = tfrecord_dir
  config = _tfrecord_config(root)
  source = sources.load_source(config)
  seen = []
  for index in range(3):  # 3 workers, 1 eval file.
    records = source.read('eval', _context(3, index), False, None)
    seen.append([int(y) for _, y, _ in _decode_all(records, source)])
  assert sorted(sum(seen, [])) == sorted(list(range(10)) + [3])
  assert all(seen)


def test_label_out_of_range_names_the_file(tfrecord_dir):
  root, _ = tfrecord_dir
  config = _tfrecord_config(root, label_offset=0, num_classes=10)
  source = sources.load_source(config)
  fn = inputs.train_input_fn(InputSpec.of(config), source, 8)
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    for _ in fn(_context()).take(10):
      pass
  message = decode.label_error(error.value, 10, 0)
  assert message.startswith('label 10 (after label_offset=0) in ')
  assert 'train-0000' in message and 'outside [0, 10)' in message


def test_pattern_that_matches_nothing(tmp_path):
  pattern = str(tmp_path / 'nothing-*.tfrecord')
  with pytest.raises(UserError, match=re.escape(f"no file matches '{pattern}'")):
    sources.load_source(_config(dataset='tfrecord', train_files=pattern,
                             eval_files=pattern, num_classes=3))


def test_tfrecord_needs_num_classes(tfrecord_dir):
  root, _ = tfrecord_dir
  with pytest.raises(UserError, match='num_classes'):
    sources.load_source(_tfrecord_config(root, num_classes=0))


# --- caching and augmentation ------------------------------------------------------


def test_augmentation_changes_between_epochs_with_cache(tfrecord_dir):
  root, good = tfrecord_dir
  config = _tfrecord_config(root, augment='inception', cache='memory',
                            shuffle_buffer=1, deterministic_input=True)
  source = sources.load_source(config)
  fn = inputs.train_input_fn(InputSpec.of(config), source, good)
  epochs = iter(fn(_context()))
  first, second = next(epochs)[0].numpy(), next(epochs)[0].numpy()
  assert first.shape == (good, 32, 32, 3)
  assert not np.array_equal(first, second)


def test_file_cache_is_written_and_reused(tfrecord_dir, tmp_path):
  root, good = tfrecord_dir
  prefix = str(tmp_path / 'cache')
  config = _tfrecord_config(root, cache=prefix)
  source = sources.load_source(config)
  dataset = inputs.train_input_fn(InputSpec.of(config), source, 8)(_context())
  # More than two passes: the cache completes, then is read twice.
  skipped = sum(int(tf.reduce_sum(s)) for _, _, s in dataset.take(8))
  assert tf.io.gfile.glob(prefix + '-train-0*')
  assert skipped == 2  # Decoded once, so counted once.


@pytest.fixture(scope='module')
def bad_last_dir(tmp_path_factory):
  """4 train files of 6 records, the last of each undecodable: the records
  that end each file, and (the files read in turn) the stream."""
  root = tmp_path_factory.mktemp('bad_last')
  for shard in range(4):
    records = [tfrecords.serialize(_encode(_image(i), 'PNG'), i + 1)
               for i in range(5)]
    records.append(tfrecords.serialize(b'not an image', 1))
    tfrecords.write(str(root / f'train-{shard:05d}-of-00004'), records)
  tfrecords.write(str(root / 'eval-00000-of-00001'), [
      tfrecords.serialize(_encode(_image(0), 'PNG'), 1)])
  return root


@pytest.mark.parametrize('cache, passes, counted', [
    ('memory', 3, 4),  # The default: decoded once, so counted once.
    ('', 3, 8),  # Decoded each pass: two passes' end before the third.
])
def test_a_bad_last_record_of_every_file_is_counted(bad_last_dir, cache,
                                                    passes, counted, capfd):
  """The default config's decoded cache counted none of these (its first
  pass ends on them, and a count rode on the next good record); every one
  is counted now, and each file named once."""
  config = _tfrecord_config(bad_last_dir, cache=cache, shuffle_buffer=1,
                            deterministic_input=True)
  source = sources.load_source(config)
  dataset = inputs.train_input_fn(InputSpec.of(config), source, 4)(_context())
  skipped = sum(int(tf.reduce_sum(s)) for _, _, s in
                dataset.take(passes * 20 // 4))
  assert skipped == counted
  named = [line for line in capfd.readouterr().err.splitlines()
           if line.startswith(decode.SKIPPED_LINE)]
  files = ', '.join(str(bad_last_dir / f'train-{shard:05d}-of-00004')
                    for shard in range(4))
  assert sorted(', '.join(named).replace(decode.SKIPPED_LINE, '').split(
      ', ')) == files.split(', ')


def _files_in_turn(root, **overrides):
  """A config that reads the 3 train files in turn, unshuffled: both bad
  records sit mid-file, so each pass counts them before its last good one
  (a count rides on the next good record)."""
  return _tfrecord_config(root, shuffle_buffer=1, deterministic_input=True,
                          **overrides)


def test_without_a_cache_skipped_records_are_counted_each_pass(tfrecord_dir):
  root, good = tfrecord_dir
  config = _files_in_turn(root, cache='')
  source = sources.load_source(config)
  dataset = inputs.train_input_fn(InputSpec.of(config), source, 8)(_context())
  batches = 3 * good // 8  # Three passes over the 24 good records.
  skipped = sum(int(tf.reduce_sum(s)) for _, _, s in dataset.take(batches))
  assert skipped == 6  # 2 bad records a pass.


@pytest.mark.parametrize('source_kind', ['tfrecord', 'tfds'])
def test_deterministic_input_repeats_the_training_order(source_kind,
                                                         tfrecord_dir,
                                                         tfds_dir):
  root, _ = tfrecord_dir
  config = (_tfrecord_config(root, cache='') if source_kind == 'tfrecord' else
            _config(data_dir=tfds_dir, dataset='sklearn_digits',
                    train_split='train', eval_split='train', cache=''))
  config.update(dict(deterministic_input=True, augment='none'))
  source = sources.load_source(config)

  def labels():
    dataset = inputs.train_input_fn(InputSpec.of(config), source, 8)(_context())
    return [int(label) for _, batch, _ in dataset.take(6) for label in batch]

  first = labels()
  assert all(labels() == first for _ in range(4))


def test_file_cache_left_locked_by_a_killed_run_is_written_anew(tfrecord_dir,
                                                               tmp_path):
  """A run killed while writing its file cache leaves a lock file and a
  temporary state file (seen with os._exit mid-pass: `PREFIX_0.lockfile`,
  `PREFIX_0.data-00000-of-00001.tempstate...`); the next run's first step
  failed with "concurrent caching iterator running". Made here by hand."""
  root, good = tfrecord_dir
  prefix = str(tmp_path / 'cache')
  (tmp_path / 'cache-train-0_0.lockfile').write_text('Created at: 1')
  (tmp_path / 'cache-train-0_0.data-00000-of-00001.tempstate123').write_text(
      'partial')
  config = _tfrecord_config(root, cache=prefix)
  dataset = inputs.train_input_fn(InputSpec.of(config),
                                  sources.load_source(config), 8)(_context())
  assert not tf.io.gfile.glob(prefix + '*.lockfile')
  assert len(list(dataset.take(8))) == 8  # Two passes: written, then read.
  assert tf.io.gfile.glob(prefix + '-train-0*.index')


def test_a_folder_is_not_a_tfrecord_file(tmp_path):
  (tmp_path / 'shards').mkdir()
  with pytest.raises(UserError, match='matches the folder .*shards; give a '
                     'glob of TFRecord files'):
    tfrecords.list_files(str(tmp_path / 'shards'))


def test_memory_cache_holds_decoded_then_encoded_then_refuses(tfds_dir):
  """Digits at 224 px: 270 MB decoded, 57 KB as stored."""
  config = _config(data_dir=tfds_dir, image_size=224)
  source = sources.load_source(config)
  spec = InputSpec.of(config)
  kind, why = cache.choose(spec, source, available_bytes=64 * 2**30)
  assert kind is cache.Kind.DECODED and 'fit in half the 64.0 GiB free' in why
  kind, why = cache.choose(spec, source, available_bytes=100 * 2**20)
  assert kind is cache.Kind.ENCODED and 'decoded and cropped each epoch' in why
  with pytest.raises(UserError, match=r'cache=memory needs about .* GiB'):
    cache.choose(spec, source, available_bytes=64 * 2**10)


@pytest.mark.parametrize('augment', augmentations.AUGMENTATIONS.names())
def test_every_augmentation_keeps_uint8_shape(tfds_dir, augment):
  config = _config(data_dir=tfds_dir, augment=augment, image_size=32)
  source = sources.load_source(config)
  images, _, _ = next(iter(inputs.train_input_fn(InputSpec.of(config),
                                                 source, 16)(_context())))
  assert images.dtype == tf.uint8 and images.shape == (16, 32, 32, 3)


# --- the uncached JPEG path: decode only the crop -------------------------------


@pytest.fixture(scope='module')
def photos():
  from pipeline.data.sources.tfrecord import photos as photo_set  # pylint: disable=g-import-not-at-top
  return list(photo_set.make_jpegs(3))


@pytest.mark.parametrize('size', [224, 64])
def test_decoding_the_window_alone_equals_cropping_the_whole(photos, size):
  """224 px from a ~300x250 window decodes it at full scale; 64 px at 1/4
  scale (libjpeg's scaled IDCT), compared with an antialiased resize."""
  window = tf.constant([10, 20, 300, 250])
  for encoded in photos:
    fast = decode.decode_window(encoded, lambda shape: window,
                               decode.square(size)).numpy()
    whole = tf.io.decode_jpeg(encoded, channels=3)[10:310, 20:270]
    slow = tf.image.resize(whole, (size, size), antialias=size < 150)
    difference = np.abs(fast.astype(float) - slow.numpy())
    assert fast.shape == (size, size, 3) and fast.dtype == np.uint8
    # Within rounding where decoded at full scale (libjpeg's upsampling of
    # colour at the window's edge moves a few pixels); within a few levels
    # where scaled.
    assert difference.mean() < (0.6 if size == 224 else 3.0), difference.mean()


def test_uncached_crops_decode_every_format_and_skip_bad_records(tfrecord_dir):
  """JPEG (fast path), PNG, grayscale and RGBA all become RGB; the two bad
  records are skipped and counted, never fatal."""
  root, good = tfrecord_dir
  config = _files_in_turn(root, cache='', augment='inception')
  source = sources.load_source(config)
  dataset = inputs.train_input_fn(InputSpec.of(config), source, good)(
      _context())
  images, labels, skipped = next(iter(dataset))
  assert images.shape == (good, 32, 32, 3) and images.dtype == tf.uint8
  assert int(tf.reduce_sum(skipped)) == 2, skipped
  # Brightness encodes the label (see _image): crops keep the pair.
  for image, label in zip(images.numpy(), labels.numpy()):
    assert abs(image.mean() - (20 * label + 32)) < 8


def _gradient_jpeg(height=300, width=400):
  """R rises with x and G with y, so a crop's extent can be read back."""
  x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
  y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
  image = np.stack([x, y, np.full_like(x, 128)], -1).astype(np.uint8)
  return tf.io.encode_jpeg(image, quality=95).numpy()


def test_cached_and_uncached_runs_see_the_same_crops(tmp_path):
  """The decoded cache keeps the whole image and samples the same box
  distribution on it as the uncached path does on the JPEG. The seed does
  not fix the draw (an op's seed counts the ops made before it in the
  process), so the bounds are statistical: 1,024 crops of each, where a
  median area moves by about 0.015 from draw to draw and the difference of
  two by about 0.02, four times below the bound."""
  tf.random.set_seed(0)
  tfrecords.write(str(tmp_path / 'train-0'),
                  [tfrecords.serialize(_gradient_jpeg(), 0)] * 64)
  extents = {}
  for setting in ('memory', ''):
    config = _config(dataset='tfrecord', train_files=str(tmp_path / 'train-*'),
                     eval_files=str(tmp_path / 'train-*'), num_classes=2,
                     image_size=64, augment='inception', cache=setting)
    dataset = inputs.train_input_fn(InputSpec.of(config),
                                    sources.load_source(config), 64)(
                                        _context())
    images = np.concatenate([b[0].numpy() for b in dataset.take(16)])
    red, green = images[..., 0].astype(float), images[..., 1].astype(float)
    extents[setting] = np.stack([
        (red.max((1, 2)) - red.min((1, 2))) / 255,
        (green.max((1, 2)) - green.min((1, 2))) / 255], -1)
  cached, uncached = extents['memory'], extents['']
  # The whole image is 4:3: boxes reach its full width, which the old cached
  # path (a random crop of the central square) never did.
  assert (cached[:, 0] > 0.85).any() and (uncached[:, 0] > 0.85).any()
  for axis in (0, 1):  # Mean extents of 1,024 crops: standard error ~0.008.
    assert abs(cached[:, axis].mean() - uncached[:, axis].mean()) < 0.06
  area = lambda e: (e[:, 0] * e[:, 1])
  assert abs(np.median(area(cached)) - np.median(area(uncached))) < 0.08


def test_encoded_cache_decodes_and_counts_each_pass(tfrecord_dir):
  root, good = tfrecord_dir
  config = _tfrecord_config(root, cache='memory', augment='inception')
  source = sources.load_source(config)
  spec = InputSpec.of(config)
  dataset = inputs.train_input_fn(spec, source, 8, cache=cache.Kind.ENCODED)(
      _context())
  batches = list(dataset.take(3 * good // 8))
  assert all(b[0].shape == (8, 32, 32, 3) for b in batches)
  assert 4 <= sum(int(tf.reduce_sum(b[2])) for b in batches) <= 6
  evaluation = inputs.eval_input_fn(spec, source, 8, cache=cache.Kind.ENCODED)(
      _context())
  assert sum(int(tf.reduce_sum(w)) for _, _, w in evaluation) == 11


def test_randaugment_takes_its_layers_and_magnitude_from_the_config():
  """More and stronger operations change an image more: the keys reach
  Keras' layer (magnitude on the paper's 0-30 scale)."""
  from pipeline.data.augmentations import tf_data  # pylint: disable=g-import-not-at-top
  image = tf.constant(_image(3, size=64))
  inception = augmentations.AUGMENTATIONS['inception_randaugment']
  changes = {}
  for layers, magnitude in ((1, 0.0), (4, 30.0)):
    # Keras' layers draw from its own seed generator, which tf's seed
    # does not reset: both, so the flips drawn are the same either way.
    keras.utils.set_random_seed(0)
    transform = tf_data.augmenter(
        inception, 64, crop=False,
        randaugment=augmentations.RandAugment(layers, magnitude))
    tf.random.set_seed(0)
    changes[layers, magnitude] = np.mean([
        np.abs(transform(image).numpy().astype(int) - _image(3, size=64)).mean()
        for _ in range(16)])
  assert changes[4, 30.0] > 2 * changes[1, 0.0], changes


@pytest.mark.parametrize('overrides, message', [
    (dict(randaugment_layers=0), 'randaugment_layers=0: expected 1 to 10 '
     'operations an image'),
    (dict(randaugment_magnitude=31.0), 'randaugment_magnitude=31.0: expected '
     "0 to 30 (the paper's scale)"),
])
def test_randaugment_settings_that_cannot_run_are_one_line(overrides, message):
  config = _config(augment='inception_randaugment', **overrides)
  with pytest.raises(UserError, match=re.escape(message)):
    augmentations.AUGMENTATIONS.check(config)
  augmentations.AUGMENTATIONS.check(_config(augment='inception', **overrides))


@pytest.mark.parametrize('name, level, pil', [
    ('Equalize', 0, lambda im: ImageOps.equalize(im)),
    ('AutoContrast', 0, lambda im: ImageOps.autocontrast(im)),
    ('Invert', 0, lambda im: ImageOps.invert(im)),
    ('Solarize', 5, lambda im: ImageOps.solarize(im, 128)),
    ('Posterize', 10, lambda im: ImageOps.posterize(im, 4)),
    ('Color', 5, lambda im: ImageEnhance.Color(im).enhance(1.0)),
])
def test_autoaugment_operations_compute_what_pil_does(name, level, pil):
  from pipeline.data.augmentations import autoaugment  # pylint: disable=g-import-not-at-top
  image = np.random.RandomState(0).randint(30, 200, (24, 24, 3)).astype(
      np.uint8)
  ours = autoaugment._operation(name, level, 24)(tf.constant(image)).numpy()  # pylint: disable=protected-access
  assert ours.dtype == np.uint8
  # Within a level: PIL's lookup tables round a product that lands on 255.
  theirs = np.asarray(pil(Image.fromarray(image))).astype(int)
  assert np.abs(ours.astype(int) - theirs).max() <= 1


def test_autoaugment_v0_draws_its_sub_policies_and_keeps_the_image_shape():
  from pipeline.data.augmentations import autoaugment  # pylint: disable=g-import-not-at-top
  image = tf.constant(_image(2, size=32)[:, :32])
  policy = autoaugment.policy_v0(32)
  tf.random.set_seed(1)
  outputs = [policy(image).numpy() for _ in range(40)]
  assert all(o.shape == (32, 32, 3) and o.dtype == np.uint8 for o in outputs)
  changed = sum(not np.array_equal(o, image.numpy()) for o in outputs)
  assert 20 <= changed < 40, changed  # Some draws leave an image as it is.
  assert len(autoaugment.POLICY_V0) == 25
