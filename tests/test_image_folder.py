"""A folder of class folders as a data set (pipeline/data/sources/image_folder/).

The tree is made here from the bundled digits: PNG and JPEG files, some in
sub-folders, one damaged file and a file manager's hidden file. It trains
as it is through `launch.train`, its eval split holds across runs and
hosts, it converts to TFRecords with its class names, and each bad tree is
one line. The same tree on the GCS emulator lists, splits, trains and
converts as it does locally. tests/test_jax_backend.py trains it on JAX.
"""

import json
import os
import shutil

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from conftest import make_tree
from conftest import run_module
from conftest import run_train
from configs import default
from pipeline.data import decode
from pipeline.data.sources.tfrecord import records as tfrecords
from pipeline.data import sources
from pipeline.errors import UserError
from pipeline.recipe import models
from pipeline.recipe import finetune

NAMES = ('eight', 'five', 'four', 'nine', 'one', 'seven', 'six', 'three',
         'two', 'zero')  # Sorted: the class indices.


@pytest.fixture(scope='module')
def tree(tmp_path_factory):
  root = tmp_path_factory.mktemp('digits_tree')
  make_tree(root)
  return root


def _config(**values):
  return ml_collections.ConfigDict(dict(default.get_config().to_dict(),
                                        **dict(dict(dataset='image_folder'),
                                               **values)))


def _paths(source, split, pipelines=1, index=0):
  context = tf.distribute.InputContext(pipelines, index, pipelines)
  return sorted(path.decode() for _, _, path in
                source.read(split, context, False, None).as_numpy_iterator())


def test_classes_files_and_a_stable_held_out_split(tree):
  source = sources.load_source(_config(train_dir=str(tree)))
  assert source.class_names == NAMES and source.num_classes == 10
  # 241 files: 24 per class and the damaged one; not the hidden file.
  assert source.num_train_examples + source.num_eval_examples == 241
  assert 10 <= source.num_eval_examples <= 45
  train, held = _paths(source, 'train'), _paths(source, 'eval')
  assert not set(train) & set(held)
  assert any('/more/' in path for path in train + held)
  # Another run, and two hosts: the same split, each host its own share.
  again = sources.load_source(_config(train_dir=str(tree)))
  assert _paths(again, 'eval') == held
  shares = [_paths(again, 'train', 2, i) for i in range(2)]
  assert not set(shares[0]) & set(shares[1])
  assert sorted(shares[0] + shares[1]) == train
  # The labels follow the sorted folder names.
  for _, label, path in source.read(
      'eval', tf.distribute.InputContext(), False, None).as_numpy_iterator():
    assert NAMES[label] in path.decode().split('/')[-3:]


def test_a_separate_eval_folder(tree, tmp_path):
  eval_root = tmp_path / 'eval'
  make_tree(eval_root, per_class=3)
  source = sources.load_source(_config(train_dir=str(tree),
                                       eval_dir=str(eval_root)))
  assert (source.num_train_examples, source.num_eval_examples) == (241, 31)
  (eval_root / 'ten').mkdir()
  (eval_root / 'ten' / 'a.png').write_bytes(
      (eval_root / 'one' / '0.png').read_bytes())
  with pytest.raises(UserError, match='both must hold the same class folders'):
    sources.load_source(_config(train_dir=str(tree), eval_dir=str(eval_root)))


def test_the_data_choose_the_size_from_a_sample_of_headers(tmp_path):
  """The median shorter side of the sampled images, read from headers:
  JPEG and PNG alike; a stray file that is no image is not sampled."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'tree'
  for index, (width, height, fmt) in enumerate(
      [(160, 120, 'JPEG'), (90, 300, 'PNG'), (400, 118, 'JPEG'),
       (122, 122, 'PNG'), (640, 480, 'JPEG')]):
    folder = root / f'class{index % 2}'
    folder.mkdir(parents=True, exist_ok=True)
    Image.new('RGB', (width, height), (index * 40, 0, 0)).save(
        folder / f'{index}.{fmt.lower().replace("jpeg", "jpg")}', fmt)
  (root / 'class0' / 'notes.txt').write_text('not an image')
  detail = sources.load_source(_config(train_dir=str(root),
                                       eval_dir=str(root))).detail()
  # Shorter sides 120, 90, 118, 122 and 480: the median is 120.
  assert detail.describe() == 'median shorter side 120 px of 5 training images'

  sizes = models.image_sizes('efficientnet_b0', 0, 0, detail)
  assert (sizes.train, sizes.eval) == (128, 128)
  assert sizes.train_from.startswith('the data: median shorter side ')


@pytest.mark.parametrize('setup, message', [
    (lambda root: None, "image folder '{root}' does not exist"),
    (lambda root: root.mkdir(), "image folder '{root}' holds no class folders"),
    (lambda root: (root / 'cat').mkdir(parents=True),
     "class folder '{root}/cat' holds no images"),
    # A file that is no image is passed over: the folder then holds none.
    (lambda root: ((root / 'cat').mkdir(parents=True),
                   (root / 'cat' / 'notes.txt').write_text('x')),
     "class folder '{root}/cat' holds no images"),
])
def test_bad_trees_in_one_line(tmp_path, setup, message):
  root = tmp_path / 'tree'
  setup(root)
  with pytest.raises(UserError) as error:
    sources.load_source(_config(train_dir=str(root)))
  assert message.format(root=root) in str(error.value)
  assert '\n' not in str(error.value)


# B0's code at a fraction of its size: the folders are tested, not the network.
TINY = '--config.model=efficientnet_tiny'


def _train(root, workdir, epochs):
  """Trains on the tree at `root`: it prints the class names and names the
  damaged file it skipped."""
  result = run_train(f'--workdir={workdir}', '--config.dataset=image_folder',
                     f'--config.train_dir={root}', f'--config.epochs={epochs}',
                     '--config.global_batch_size=32', TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'Classes: {", ".join(NAMES)}' in result.stderr
  assert f'{decode.SKIPPED_LINE}{root}/three/damaged.png' in result.stderr


@pytest.fixture(scope='module')
def trained(tree, tmp_path_factory):
  """The issue's command: 3 epochs on the tree (a workdir)."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  _train(tree, workdir, epochs=3)
  return workdir


def test_trains_records_the_names_and_predict_names_a_file(tree, trained):
  """The issue's command: trains, holds out an eval split, prints and
  records the class names; the damaged file is skipped, counted and named;
  the exported model names a file's class; a changed tree will not resume."""
  workdir = trained
  run = json.loads((workdir / 'run.json').read_text())
  assert run['resolved']['class_names'] == list(NAMES)
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['skipped_records'] >= 1  # The damaged PNG, once an epoch.
  image = tree / 'seven' / '0.png'
  answers = workdir.parent / 'predicted.json'
  predicted = run_module('launch.predict', f'--model={workdir}/export',
                         f'--output={answers}', str(image))
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  # The classes it names are the export's own likeliest, by name, in
  # order: the export's probabilities for the file, read here.
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from pipeline.data import decode  # pylint: disable=g-import-not-at-top
  export = tf.saved_model.load(str(workdir / 'export'))
  metadata = json.loads((workdir / 'export' / 'metadata.json').read_text())
  assert metadata['class_names'] == list(NAMES)
  pixels = decode.eval_image(image.read_bytes(),
                             metadata['preprocessing']['image_size'],
                             metadata['preprocessing']['central_fraction'])
  probabilities = export.serve(pixels[None]).numpy()[0]
  likeliest = [NAMES[i] for i in np.argsort(-probabilities)[:3]]
  (answer,) = json.loads(answers.read_text())
  assert [row['class'] for row in answer['top']] == likeliest
  assert f"{image}: {likeliest[0]} {probabilities.max():.3f}" in (
      predicted.stdout)

  (tree / 'zero').rename(tree / 'nought')
  try:
    # The same command, the same recipe: only the tree changed.
    again = run_train(f'--workdir={workdir}', '--config.dataset=image_folder',
                      f'--config.train_dir={tree}', '--config.epochs=3',
                      '--config.global_batch_size=32', TINY, '--dry_run')
  finally:
    (tree / 'nought').rename(tree / 'zero')
  assert again.returncode == 1
  assert 'holds a run trained on 10 classes; these data have 10 ' \
      '(differing: nought, zero)' in again.stderr


def test_init_from_a_run_of_other_class_names_is_refused(tree, trained,
                                                       tmp_path):
  """init_from a run of these class names carries its head (a warm start);
  of other names it is one line, before anything is built, unless
  init_head=False takes the backbone alone."""
  renamed = tmp_path / 'renamed'
  shutil.copytree(tree, renamed)
  (renamed / 'zero').rename(renamed / 'nought')

  def dry_run(root, *flags):
    return run_train(f'--workdir={tmp_path / "tuned"}', '--dry_run',
                     '--config.dataset=image_folder',
                     f'--config.train_dir={root}',
                     f'--config.init_from={trained}', TINY, *flags)

  refused = dry_run(renamed)
  assert refused.returncode == 1
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: init_from='{trained}' trained 10 classes; these data have 10 "
      '(differing: nought, zero); pass --config.init_head=False to take its '
      'backbone alone with a new head for these classes, or start from a run '
      'of these classes')
  backbone = dry_run(renamed, '--config.init_head=False')
  assert backbone.returncode == 0, backbone.stderr[-3000:]
  assert f'; backbone from the run in {trained}' in backbone.stderr
  same = dry_run(tree)
  assert same.returncode == 0, same.stderr[-3000:]
  assert (f'; head (the same 10 classes) and backbone from the run in '
          f'{trained}') in same.stderr

  # The weights that arrive: the run's newest checkpoint, head and all; or
  # its backbone under a new head.
  config = _config(train_dir=str(tree), init_from=str(trained),
                   model='efficientnet_tiny', image_size=32)
  step = json.loads((trained / 'metrics.json').read_text())['train_steps']
  saved = models.build_model(config.model, 10, config.image_size)
  tf.train.Checkpoint(model=saved).read(
      str(trained / 'checkpoints' / f'ckpt-{step}')).expect_partial()
  for init_head, carried in ((True, saved.weights),
                             (False, models.backbone(saved).weights)):
    config.init_head = init_head
    model = models.build_model(config.model, 10, config.image_size)
    said = finetune.load_init_from(finetune.FineTuning.of(config), model,
                                   NAMES, str(tmp_path))
    assert said == (f'{"head (the same 10 classes) and " * init_head}'
                    f'backbone from step {step} of the run in {trained}')
    same_as_saved = [np.array_equal(mine, theirs) for mine, theirs in
                     zip(model.get_weights(), saved.get_weights())]
    assert sum(same_as_saved) == len(carried), (init_head, said)
    assert same_as_saved[-1] is init_head  # The head's bias.


def test_to_tfrecords_with_the_class_names(tree, tmp_path):
  output = tmp_path / 'records'
  result = run_module('launch.make_tfrecords', f'--from_dir={tree}',
                      f'--output_dir={output}', '--num_files=2')
  assert result.returncode == 0, result.stderr[-3000:]
  assert (output / tfrecords.LABELS_FILE).read_text().split() == list(NAMES)
  folder = sources.load_source(_config(train_dir=str(tree)))
  records = sources.load_source(_config(
      dataset='tfrecord', train_files=str(output / 'train-*'),
      eval_files=str(output / 'eval-*'), num_classes=10))
  assert records.class_names == NAMES
  assert (records.num_train_examples, records.num_eval_examples) == (
      folder.num_train_examples, folder.num_eval_examples)
  assert sorted(os.listdir(output)) == [
      'eval-00000-of-00002', 'eval-00001-of-00002', 'labels.txt',
      'train-00000-of-00002', 'train-00001-of-00002']



def test_a_folder_of_photographs_resolves_as_it_is(tmp_path):
  """Several hundred real photographs in class folders (crops of the ones
  scikit-image and scikit-learn ship, sides of 80-320 px, a stray text
  file among them), with no flag but the source and the folder: the data
  choose the network's own 224 px (not the digits' 32) and a mirrored
  augmentation, and the stray file is counted (a dry run: nothing
  trained, nothing written)."""
  from photo_folder import write  # pylint: disable=g-import-not-at-top
  photos = tmp_path / 'photos'
  write(str(photos), per_class=60)
  result = run_train('--config.dataset=image_folder',
                     f'--config.train_dir={photos}', '--dry_run',
                     f'--workdir={tmp_path / "run"}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f'Passed over 1 file(s) in {photos} that are not JPEG, PNG, GIF, '
          f'BMP or WebP files') in result.stderr
  assert ("224 px training (efficientnet_b0's own: tensorflow/tpu's "
          'EfficientNet recipe; the data hold as much: median shorter side '
          ) in result.stderr
  assert ('augment inception (image_folder holds photographs, which may be '
          'mirrored)') in result.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow  # Minutes of B0: CI's slow tier.
def test_a_folder_of_small_photographs_trains_as_it_is(tmp_path):
  """The same photographs at 64-128 px (so the run is a quarter of 224
  px's work), trained with no flag but the source, the folder and a few
  epochs: the data cap the size, and evaluation is far above chance (a
  sixth). At 224 px the same recipe reached 0.70 and 0.96 at 10 and 12
  epochs (BUILD_NOTES)."""
  from photo_folder import write  # pylint: disable=g-import-not-at-top
  photos = tmp_path / 'photos'
  write(str(photos), per_class=60, sides=(64, 128))
  workdir = tmp_path / 'run'
  result = run_train('--config.dataset=image_folder',
                     f'--config.train_dir={photos}', '--config.epochs=12',
                     f'--workdir={workdir}', timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  resolved = json.loads((workdir / 'run.json').read_text())['resolved']
  assert 64 <= resolved['image_size'] <= 128, resolved['image_size']
  assert resolved['augment'] == 'inception'
  assert 'px training (the data: median shorter side ' in result.stderr
  metrics = json.loads((workdir / 'metrics.json').read_text())
  assert metrics['eval_accuracy'] >= 0.6, metrics['eval_accuracy']
  assert metrics['learning_warning'] is None


@pytest.mark.slow
def test_tfrecords_from_a_folder_train_to_the_folders_accuracy(tmp_path):
  """Every digit as a file (1,797), trained as a folder and, converted, as
  TFRecords with the same split and recipe (the default's, on the tiny
  network and shorter: the data are tested, not B0): the same accuracy,
  well above chance (0.10), up to the order the two read their examples
  in."""
  tree = tmp_path / 'digits'
  make_tree(tree, per_class=200)
  output = tmp_path / 'records'
  converted = run_module('launch.make_tfrecords', f'--from_dir={tree}',
                         f'--output_dir={output}', '--num_files=4')
  assert converted.returncode == 0, converted.stderr[-3000:]
  accuracy = {}
  for name, flags in (
      ('folder', ('--config.dataset=image_folder',
                  f'--config.train_dir={tree}')),
      ('tfrecord', ('--config.dataset=tfrecord', '--config.num_classes=10',
                    f'--config.train_files={output}/train-*',
                    f'--config.eval_files={output}/eval-*'))):
    # Digits: shifted, never mirrored (a folder's and a record file's own
    # augmentation is a photograph's, with flips).
    result = run_train(f'--workdir={tmp_path / name}',
                       '--config.model=efficientnet_tiny',
                       '--config.augment=translate',
                       '--config.epochs=8', *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / name / 'metrics.json').read_text())
    accuracy[name] = metrics['eval_accuracy']
  print('eval accuracy', accuracy)
  assert min(accuracy.values()) > 0.8, accuracy
  assert abs(accuracy['folder'] - accuracy['tfrecord']) <= 0.05, accuracy

@pytest.fixture(scope='module')
def gcs_tree(emulator, tree):
  """The same tree in the emulator's bucket, and a class folder that holds
  only the empty `name/` object a console makes for a folder."""
  bucket = emulator.client().bucket('runs')
  for path in sorted(tree.rglob('*')):
    if path.is_file():
      bucket.blob(f'photos/{path.relative_to(tree)}').upload_from_filename(
          str(path))
  bucket.blob('empty_class/cat/').upload_from_string(b'')
  bucket.blob('empty_class/dog/1.png').upload_from_filename(
      str(tree / 'one' / '0.png'))
  return 'gs://runs/photos'


def test_on_cloud_storage_the_same_classes_split_and_bytes(gcs_tree, tree):
  """One listing of the bucket gives what the local walk gives: the same
  names, labels and held-out split (hashed on paths below the root)."""
  local = sources.load_source(_config(train_dir=str(tree)))
  remote = sources.load_source(_config(train_dir=gcs_tree))
  assert remote.class_names == NAMES
  for split in ('train', 'eval'):
    assert [p.replace(gcs_tree, str(tree)) for p in _paths(remote, split)] == \
        _paths(local, split)
  context = tf.distribute.InputContext()
  read = {path.decode(): (encoded, label) for encoded, label, path in
          remote.read('eval', context, False, None).as_numpy_iterator()}
  for path, (encoded, label) in list(read.items())[:5]:
    local_path = path.replace(gcs_tree, str(tree))
    assert encoded == open(local_path, 'rb').read()
    assert NAMES[label] == local_path.split('/')[len(str(tree).split('/'))]


@pytest.mark.parametrize('root, message', [
    ('gs://runs/no_such_tree', "image folder 'gs://runs/no_such_tree' does "
     'not exist'),
    ('gs://no-such-bucket/photos', "bucket 'no-such-bucket' does not exist"),
    ('gs://runs/empty_class', "class folder 'gs://runs/empty_class/cat' "
     'holds no images'),
])
def test_bad_trees_on_cloud_storage_in_one_line(gcs_tree, root, message):
  del gcs_tree
  with pytest.raises(UserError) as error:
    sources.load_source(_config(train_dir=root))
  assert message in str(error.value) and '\n' not in str(error.value)


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_trains_from_cloud_storage_and_converts_from_it(gcs_tree, tmp_path):
  _train(gcs_tree, tmp_path / 'run', epochs=1)
  output = tmp_path / 'records'
  converted = run_module('launch.make_tfrecords', f'--from_dir={gcs_tree}',
                         f'--output_dir={output}', '--num_files=1')
  assert converted.returncode == 0, converted.stderr[-3000:]
  assert (output / tfrecords.LABELS_FILE).read_text().split() == list(NAMES)
