"""A CSV of image paths and labels as a data set (pipeline/data/sources/csv_list/).

The digits written as PNG files by conftest.make_tree (one damaged), and
CSVs beside them as Kaggle ships them: paths relative to the CSV, one
absolute, one naming a file that is not there; labels as class names or as
integers. Both train through `launch.train`; the named one evaluates and
`launch.predict` names a file's class. Each malformed CSV is one line.
"""

import csv
import json

import ml_collections
import pytest
import tensorflow as tf

from conftest import make_tree
from conftest import run_module
from conftest import run_train
from configs import default
from pipeline.data import decode
from pipeline.data import sources
from pipeline.errors import UserError

NAMES = ('eight', 'five', 'four', 'nine', 'one', 'seven', 'six', 'three',
         'two', 'zero')  # Sorted: the class indices.
TINY = '--config.model=efficientnet_tiny'


def _write_csv(path, rows, header=('image', 'label')):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  return path


@pytest.fixture(scope='module')
def digits(tmp_path_factory):
  """(folder, [(path relative to it, class name)]): every file of the tree,
  one row absolute, and one file that is not there."""
  root = tmp_path_factory.mktemp('digits_csv')
  make_tree(root / 'images', per_class=16)
  rows = sorted((str(path.relative_to(root)), path.relative_to(
      root / 'images').parts[0]) for path in (root / 'images').rglob('*.*')
                if path.name != '.DS_Store')
  rows[0] = (str(root / rows[0][0]), rows[0][1])
  rows.append(('images/seven/missing.png', 'seven'))  # Its hash: train.
  return root, rows


def _config(**values):
  return ml_collections.ConfigDict(dict(default.get_config().to_dict(),
                                        dataset='csv', **values))


def test_names_or_integers_give_the_same_classes(digits):
  root, rows = digits
  named = sources.load_source(_config(train_csv=str(_write_csv(
      root / 'named.csv', rows))))
  assert named.class_names == NAMES and named.num_classes == 10
  numbered = sources.load_source(_config(train_csv=str(_write_csv(
      root / 'numbered.csv', [(p, NAMES.index(n)) for p, n in rows]))))
  assert numbered.class_names == () and numbered.num_classes == 10
  # 162 rows: 16 a class, the damaged file and the missing one; held out by
  # the hash of the path, the same rows either way.
  for source in (named, numbered):
    assert (source.num_train_examples, source.num_eval_examples) == (147, 15)
  context = tf.distribute.InputContext()
  held = [sorted(path for _, _, path in source.read(
      'eval', context, False, None).as_numpy_iterator())
          for source in (named, numbered)]
  assert held[0] == held[1]


def test_an_eval_csv_is_the_eval_split(digits):
  root, rows = digits
  source = sources.load_source(_config(
      train_csv=str(_write_csv(root / 'train.csv', rows[:100])),
      eval_csv=str(_write_csv(root / 'eval.csv', rows[100:]))))
  assert (source.num_train_examples, source.num_eval_examples) == (100, 62)


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_named_classes_train_evaluate_and_predict_names_a_file(digits,
                                                               tmp_path):
  """The issue's command on the default config (a decoded cache): the
  damaged file and the missing one are skipped, counted and named."""
  root, rows = digits
  train_csv = _write_csv(root / 'kaggle.csv', rows)
  workdir = tmp_path / 'run'
  result = run_train(f'--workdir={workdir}', '--config.dataset=csv',
                     f'--config.train_csv={train_csv}', '--config.epochs=2',
                     '--config.global_batch_size=32', TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'Classes: {", ".join(NAMES)}' in result.stderr
  assert (f'1 file(s) the CSV names are missing, e.g. '
          f'{root}/images/seven/missing.png') in result.stderr
  for bad in ('three/damaged.png', 'seven/missing.png'):
    assert f'{decode.SKIPPED_LINE}{root}/images/{bad}' in result.stderr, (
        result.stderr[-3000:])
  run = json.loads((workdir / 'run.json').read_text())
  assert run['resolved']['class_names'] == list(NAMES)
  metrics = json.loads((workdir / 'metrics.json').read_text())
  # Both files of the train split, once: the cache is filled by one whole
  # pass, and 8 steps of 32 read past its 145 examples.
  assert metrics['skipped_records'] == 2
  assert metrics['eval_examples'] > 0

  evaluated = run_module('launch.evaluate', f'--workdir={workdir}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert f'{metrics["eval_accuracy"]:.4f}' in evaluated.stdout
  answers = tmp_path / 'predicted.json'
  predicted = run_module('launch.predict', f'--model={workdir}/export',
                         f'--output={answers}',
                         str(root / 'images' / 'seven' / '0.png'))
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  # The classes it answers with are the CSV's names (the file's path, which
  # names one of them too, is not what is read).
  (answer,) = json.loads(answers.read_text())
  top = [row['class'] for row in answer['top']]
  assert len(top) == 3 and len(set(top)) == 3 and set(top) <= set(NAMES), top
  assert f"{answer['file']}: {top[0]} " in predicted.stdout


@pytest.mark.slow  # Half a minute or more: the fast suite's 12 minutes.
def test_integer_labels_train_uncached_counting_both_bad_files(digits,
                                                              tmp_path):
  root, rows = digits
  train_csv = _write_csv(root / 'ints.csv',
                         [(i, p, NAMES.index(n)) for i, (p, n) in
                          enumerate(rows)], header=('id', 'filename', 'class'))
  result = run_train(f'--workdir={tmp_path / "run"}', '--config.dataset=csv',
                     f'--config.train_csv={train_csv}', '--config.epochs=1',
                     '--config.global_batch_size=29', '--config.cache=none',
                     '--config.deterministic_input=true', TINY)
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((tmp_path / 'run' / 'metrics.json').read_text())
  assert metrics['eval_examples'] == 15
  # Without a cache the stream is endless and a skipped record is counted
  # with the example after it. One epoch of 5 steps of 29 takes all 145
  # decodable records of the first pass, so the damaged file and the
  # missing one are counted once each; in a fixed order (seeded), for a bad
  # record that ended the pass would be counted with the next pass.
  assert metrics['skipped_records'] == 2


@pytest.mark.parametrize('text, message', [
    ('', "the CSV '{csv}' is empty; expected a header row naming a path "
     'column (path, image, file, filename) and a label column (label, '
     'class, category)'),
    ('image,label\n', "the CSV '{csv}' has a header and no rows"),
    ('picture,label\na.png,cat\n', "row 1 of '{csv}' (picture,label) names "
     'no path column; expected a header row'),
    ('image,kind\na.png,cat\n', "row 1 of '{csv}' (image,kind) names no "
     'label column'),
    ('image,label\na.png,cat\nb.png\n', "row 3 of '{csv}' has 1 field(s); "
     'its header has 2'),
    ('image,label\na.png,\n', "row 2 of '{csv}' has an empty label"),
    ('image,label\na.png,cat\nb.png,3\nc.png,dog\n', "row 2 of '{csv}' has "
     "the label 'cat', a name, and row 3 of '{csv}' has '3', a number; use "
     'class names throughout, or integers from 0'),
    ('image,label\na.png,-1\n', "row 2 of '{csv}' has the label -1; integer "
     'labels count from 0'),
])
def test_a_malformed_csv_is_one_line_naming_the_row(text, message, tmp_path):
  path = tmp_path / 'bad.csv'
  path.write_text(text)
  with pytest.raises(UserError) as raised:
    sources.load_source(_config(train_csv=str(path), eval_fraction=0.5))
  assert str(raised.value).startswith(message.format(csv=path)), raised.value


def test_an_eval_csv_of_files_none_of_which_is_there_is_one_line(digits):
  root, rows = digits
  eval_csv = _write_csv(root / 'gone.csv', [('gone/a.png', 'one'),
                                            ('gone/b.png', 'two')])
  with pytest.raises(UserError) as raised:
    sources.load_source(_config(
        train_csv=str(_write_csv(root / 'all.csv', rows)),
        eval_csv=str(eval_csv)))
  assert str(raised.value) == (
      f'none of the 2 eval file(s) the CSV names is there, e.g. '
      f'{root}/gone/a.png')


@pytest.mark.parametrize('flags, message', [
    ([], 'error: dataset=csv needs --config.train_csv=PATH, a CSV of image '
     'paths and labels (local or gs://)'),
    (['--config.train_csv=/no/such.csv'], "error: cannot read the CSV "
     "'/no/such.csv': "),
])
def test_the_launcher_says_what_is_missing_in_one_line(flags, message,
                                                       tmp_path):
  result = run_train(f'--workdir={tmp_path / "run"}', '--config.dataset=csv',
                     *flags, '--dry_run')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(message), (
      result.stderr[-2000:])
