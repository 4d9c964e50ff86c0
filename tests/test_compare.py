"""`python -m launch.compare`: policies side by side, from the same start.

The end-to-end case is the smallest real comparison (B0 at 32 px on 256
digits, one epoch, float32 against mixed_bfloat16 with the batch doubled);
the planning rules are checked without training.
"""

import json
import os
import re
import shutil
import sys

import pytest

from conftest import REPO
from conftest import run_module
from conftest import tiny_args
from pipeline.reports import compare
from pipeline.reports.compare import report as comparison_report
from pipeline.errors import UserError
from pipeline.rules.speed import step_counts


def run_compare(*args, timeout=600):
  return run_module('launch.compare', *args, timeout=timeout)


def _tiny(root, tfds_dir, *extra):
  # The comparison picks the eval cadence itself (four points a curve).
  return [arg for arg in tiny_args(root, tfds_dir, '--config.epochs=1',
                                   '--config.steps_per_execution=2',
                                   '--config.log_every_steps=2', *extra)
          if arg != '--config.eval_every_epochs=0']


@pytest.fixture(scope='module')
def compared(tmp_path_factory, tfds_dir):
  """float32 (batch 32) against mixed_bfloat16 (batch 64), one epoch each:
  two child runs, about 2.5 minutes on 2 cores, so its tests are in the
  slow tier (CI runs it every time)."""
  root = str(tmp_path_factory.mktemp('compare'))
  result = run_compare(*_tiny(root, tfds_dir),
                       '--policies=float32,mixed_bfloat16',
                       '--double_batch_16bit')
  assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
  with open(os.path.join(root, 'comparison.json')) as f:
    return root, result, json.load(f)


def _runs(summary):
  return {r['name']: r for r in summary['runs']}


@pytest.mark.slow
def test_table_printed_and_written(compared):
  root, result, summary = compared
  with open(os.path.join(root, 'comparison.md')) as f:
    markdown = f.read()
  for text in (result.stdout, markdown):
    rows = [l for l in text.splitlines() if l.startswith('| ')]
    assert rows[0].startswith('| policy | global batch | steps |')
    assert [r.split('|')[1].strip() for r in rows[2:]] == ['float32',
                                                           'mixed_bfloat16']
  assert 'identical across policies' in markdown
  assert f'tensorboard --logdir {root}' in result.stdout
  assert '[1/2] float32: done' in result.stdout
  assert '[2/2] mixed_bfloat16: done' in result.stdout


@pytest.mark.slow
def test_json_rows_hold_every_figure(compared):
  _, _, summary = compared
  rows = {r['policy']: r for r in summary['rows']}
  assert set(rows) == {'float32', 'mixed_bfloat16'}
  runs = _runs(summary)
  for policy, row in rows.items():
    assert row['images_per_sec'] > 0 and row['compile_s'] > 0
    assert row['epoch_s'] == pytest.approx(256 / row['images_per_sec'])
    assert row['peak_memory_bytes'] > 100 * 2**20
    assert row['peak_memory_kind'] == 'host RSS'
    # One seed: the row is that run's metrics.json.
    assert row['eval_accuracy'] == runs[policy]['metrics']['eval_accuracy']
    assert row['eval_loss'] == runs[policy]['metrics']['eval_loss']
    assert row['final_loss_scale'] is None and row['skipped_steps'] is None
  assert rows['float32']['speedup'] == pytest.approx(1.0)
  assert rows['float32']['accuracy_delta_points'] == 0.0
  assert rows['mixed_bfloat16']['speedup'] == pytest.approx(
      rows['mixed_bfloat16']['images_per_sec'] /
      rows['float32']['images_per_sec'])
  assert rows['mixed_bfloat16']['accuracy_delta_points'] == pytest.approx(
      100 * (rows['mixed_bfloat16']['eval_accuracy'] -
             rows['float32']['eval_accuracy']))
  assert summary['failed'] == []


@pytest.mark.slow
def test_runs_start_from_identical_weights(compared):
  _, _, summary = compared
  metrics = [r['metrics'] for r in summary['runs']]
  initial = {m['initial_weights_sha256'] for m in metrics}
  assert len(initial) == 1 and len(next(iter(initial))) == 64
  # Training moved them, differently per policy: the digest is not a constant.
  assert all(m['weights_sha256'] not in initial for m in metrics)
  assert summary['initial_weights_identical'] is True
  assert {m['seed'] for m in metrics} == {0}


@pytest.mark.slow
def test_doubled_batch_sees_the_same_examples(compared):
  _, _, summary = compared
  runs = _runs(summary)
  float32, bfloat16 = runs['float32']['metrics'], runs['mixed_bfloat16'][
      'metrics']
  assert (float32['global_batch_size'], float32['total_steps']) == (32, 8)
  assert (bfloat16['global_batch_size'], bfloat16['total_steps']) == (64, 4)
  seen = {m['total_steps'] * m['global_batch_size'] for m in (float32,
                                                              bfloat16)}
  assert seen == {256}
  assert summary['examples_per_epoch'] == 256
  assert {r['examples_seen'] for r in summary['rows']} == {256}


@pytest.mark.slow
def test_plot_is_a_real_png(compared):
  root, _, _ = compared
  with open(os.path.join(root, 'comparison.png'), 'rb') as f:
    image = f.read()
  assert image.startswith(b'\x89PNG\r\n\x1a\n') and len(image) > 10_000


@pytest.mark.slow
def test_each_run_has_its_log_and_tensorboard_under_the_root(compared):
  root, _, _ = compared
  for name in ('float32', 'mixed_bfloat16'):
    run = os.path.join(root, name)
    assert 'Precision: ' + name in open(os.path.join(run, 'train.log')).read()
    for split, tag in (('train', 'loss'), ('eval', 'accuracy')):
      points = comparison_report.read_scalars(os.path.join(run, 'tensorboard', split),
                                    tag)
      assert points, (name, split)
    # Steps are the run's own: the doubled batch takes half as many. A
    # short run's loss curve has a point per step, not per log line, and
    # the comparison asks for evaluations along the way, not just the last.
    steps = 8 if name == 'float32' else 4
    losses = comparison_report.read_scalars(
        os.path.join(run, 'tensorboard', 'train'), 'loss')
    assert [step for step, _ in losses] == list(range(1, steps + 1))
    # Four points a curve, as the comparison asks: an execution ends
    # where an evaluation is due.
    evals = comparison_report.read_scalars(
        os.path.join(run, 'tensorboard', 'eval'), 'accuracy')
    assert [step for step, _ in evals] == (
        [2, 4, 6, 8] if name == 'float32' else [1, 2, 3, 4])


@pytest.mark.slow
def test_rerun_reuses_finished_runs_and_reports_a_failed_one(compared,
                                                             tmp_path,
                                                             tfds_dir):
  source_root, _, _ = compared
  root = str(tmp_path / 'again')
  shutil.copytree(source_root, root)
  # 3 replicas cannot split batch 64: the new run fails in its first lines.
  result = run_compare(*_tiny(root, tfds_dir),
                       '--policies=float32,mixed_bfloat16,mixed_float16',
                       '--double_batch_16bit', '--num_cpu_devices=3')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert '[1/3] float32: finished earlier' in result.stdout
  assert '[2/3] mixed_bfloat16: finished earlier' in result.stdout
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr[-2000:]
  assert 'run mixed_float16 failed' in errors[0]
  assert os.path.join(root, 'mixed_float16', 'train.log') in errors[0]
  assert 'global_batch_size=64' in errors[0]
  with open(os.path.join(root, 'comparison.json')) as f:
    summary = json.load(f)
  assert summary['failed'] == ['mixed_float16']
  assert [r['policy'] for r in summary['rows']] == ['float32',
                                                    'mixed_bfloat16']


@pytest.mark.slow
def test_rewrite_runs_alone_through_compare(tmp_path, tfds_dir):
  root = str(tmp_path / 'rewrite')
  result = run_compare(*_tiny(root, tfds_dir), '--policies=rewrite')
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(root, 'comparison.json')) as f:
    summary = json.load(f)
  (row,) = summary['rows']
  assert row['policy'] == 'rewrite' and row['images_per_sec'] > 0
  assert row['speedup'] is None and row['accuracy_delta_points'] is None
  assert 'No float32 run' in open(os.path.join(root, 'comparison.md')).read()
  metrics = summary['runs'][0]['metrics']
  assert metrics['policy'] == 'rewrite' and metrics['xla'] is False
  assert metrics['final_loss_scale'] is None  # bfloat16 on CPU: no scaling.
  log = open(os.path.join(root, 'rewrite', 'train.log')).read()
  assert 'Graph rewrite: eligible ops compute in bfloat16' in log
  assert 'XLA: off (--policy=rewrite' in log


@pytest.mark.parametrize('flags, named', [
    (['--policies=float32,fp8'], "'fp8'"),
    (['--policies=auto'], "'auto'"),
])
def test_bad_policy_fails_in_one_line(tmp_path, flags, named):
  result = run_compare(*flags, f'--workdir={tmp_path / "root"}', timeout=300)
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and named in errors[0], result.stderr[-2000:]
  assert 'accepted: float32, mixed_float16' in errors[0]
  assert 'rewrite' in errors[0]
  assert not os.path.exists(tmp_path / 'root')


@pytest.mark.parametrize('value, message', [
    ('', '--policies names no policy'), ('float32,float32', 'names a policy '
                                         'twice'),
    ('float32,mixed', "unknown policy 'mixed'; accepted: float32, "
     'mixed_float16, mixed_bfloat16, float16, bfloat16, rewrite')])
def test_policy_list_is_checked_as_flags_parse(value, message):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from launch import cli  # pylint: disable=g-import-not-at-top
  flag_values = flags.FlagValues()
  cli.define_policy_list('policies', ['float32'], 'Policies.',
                         flag_values=flag_values)
  flag_values(['prog', '--policies=float32, rewrite'])
  assert flag_values.policies == ['float32', 'rewrite']
  with pytest.raises(flags.IllegalFlagValueError, match=message):
    flag_values(['prog', f'--policies={value}'])


def test_seed_list_is_checked():
  assert compare.parse_seeds('', 7) == [7]
  assert compare.parse_seeds('0,1,2', 7) == [0, 1, 2]
  with pytest.raises(UserError, match='integers'):
    compare.parse_seeds('0,one', 0)


def test_batch_doubling_keeps_examples_equal():
  runs = compare.plan_runs(['float32', 'mixed_float16', 'rewrite'], [0, 1],
                           64, True, 'root')
  assert [(r.name, r.global_batch_size) for r in runs] == [
      ('float32_seed0', 64), ('float32_seed1', 64),
      ('mixed_float16_seed0', 128), ('mixed_float16_seed1', 128),
      ('rewrite_seed0', 128), ('rewrite_seed1', 128)]
  batches = [r.global_batch_size for r in runs]
  # The digits' 1,438 training examples: 11 batches of 128 fit.
  examples = step_counts.examples_per_epoch(0, 1438, batches)
  assert examples == 1408
  steps = {b: step_counts.epoch_steps(examples, 1438, b) for b in set(batches)}
  assert steps == {64: 22, 128: 11}
  assert {b * s for b, s in steps.items()} == {1408}
  # Without doubling, the whole set rounded down to the batch, as before.
  assert step_counts.examples_per_epoch(0, 1438, [64, 64]) == 1408
  assert step_counts.epoch_steps(0, 1438, 64) == 22


@pytest.mark.parametrize('requested, batches, message', [
    (1000, [64, 128], 'not a multiple of global batch 64'),
    (0, [2048], 'larger than the 1438'),
])
def test_examples_per_epoch_mistakes(requested, batches, message):
  with pytest.raises(UserError, match=message):
    step_counts.examples_per_epoch(requested, 1438, batches)


def test_epoch_steps_refuses_partial_batches():
  with pytest.raises(UserError, match='examples_per_epoch=100 must be 0'):
    step_counts.epoch_steps(100, 1438, 64)


def test_children_get_the_overrides_and_the_comparison_settings_last(
    monkeypatch):
  """Built from the parsed flags: config file, overrides, hardware flags."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from launch import cli  # pylint: disable=g-import-not-at-top
  from launch import compare as launcher  # pylint: disable=g-import-not-at-top,unused-import
  config_file = os.path.join(REPO, 'configs', 'default.py')
  argv = ['compare', f'--config={config_file}', '--config.epochs=3',
          '--policies=float32,rewrite', '--workdir', '/tmp/x',
          '--double_batch_16bit', '--num_cpu_devices=2', '--seeds=0,1']
  monkeypatch.setattr(sys, 'argv', argv)  # ml_collections reads overrides here.
  flags.FLAGS(argv)
  try:
    forwarded = cli.config_args() + cli.hardware_args()
  finally:
    flags.FLAGS.unparse_flags()
  assert forwarded == [f'--config={config_file}', '--config.epochs=3',
                       '--num_cpu_devices=2']
  run = compare.Run('rewrite', 1, 128, '/r/rewrite_seed1')
  command = compare.child_command(run, forwarded, 1408)
  assert command[:3] == [sys.executable, '-m', 'launch.train']
  assert command[3:6] == forwarded
  assert command[6:] == [
      '--workdir=/r/rewrite_seed1', '--policy=rewrite', '--config.seed=1',
      '--config.global_batch_size=128', '--config.examples_per_epoch=1408',
      '--config.deterministic_input=true', '--config.eval_every_epochs=0.25']
  user_choice = compare.child_command(
      run, ['--config.deterministic_input=false'], 1408)
  assert user_choice.count('--config.deterministic_input=false') == 1
  assert '--config.deterministic_input=true' not in user_choice


def _metrics(policy, seed, rate, accuracy, batch=64, loss_scale=None):
  return {'policy': policy, 'seed': seed, 'global_batch_size': batch,
          'total_steps': 1408 // batch, 'train_images_per_sec': rate,
          'compile_s': 10.0, 'peak_memory_bytes': 2**30,
          'peak_memory_kind': 'host RSS', 'eval_accuracy': accuracy,
          'eval_loss': 0.5, 'final_loss_scale': loss_scale,
          'skipped_steps': 3 if loss_scale else 0,
          'initial_weights_sha256': f'seed{seed}'}


def test_seed_means_and_deltas_against_float32():
  runs = compare.plan_runs(['float32', 'mixed_float16'], [0, 1], 64, True,
                           'root')
  metrics = {
      'float32_seed0': _metrics('float32', 0, 100, 0.90),
      'float32_seed1': _metrics('float32', 1, 110, 0.94),
      'mixed_float16_seed0': _metrics('mixed_float16', 0, 200, 0.91, 128,
                                      32768.0),
      'mixed_float16_seed1': _metrics('mixed_float16', 1, 220, 0.95, 128,
                                      16384.0),
  }
  rows = comparison_report.summarize(runs, metrics, 1408)
  float32, float16 = rows
  assert float32['images_per_sec'] == 105 and float16['images_per_sec'] == 210
  assert float16['speedup'] == pytest.approx(2.0)
  assert float16['accuracy_delta_points'] == pytest.approx(1.0)
  assert float16['eval_accuracy_per_seed'] == [0.91, 0.95]
  assert float16['epoch_s'] == pytest.approx(1408 / 210)
  assert float16['final_loss_scale'] == 24576.0
  assert float16['skipped_steps'] == 3 and float32['skipped_steps'] is None
  assert comparison_report.initial_weights(runs, metrics) == {0: ['seed0'],
                                                   1: ['seed1']}
  table = comparison_report.markdown_table(rows)
  assert '| mixed_float16 | 128 | 11 | 1,408 | 210 |' in table
  assert '| 2.00 | +1.00 |' in table


def test_keras_fit_stands_beside_each_keras_policy():
  """Keras' own model.fit beside float32 and mixed_bfloat16 (no peer for
  the graph rewrite, which is no Keras policy): its own launcher, its own
  folder, its speed-up against its own float32, and ours over it."""
  runs = compare.plan_runs(['float32', 'mixed_bfloat16', 'rewrite'], [0], 64,
                           False, 'root', keras_fit=True)
  assert [(r.name, r.trainer) for r in runs] == [
      ('float32', 'ours'), ('keras_fit_float32', 'keras_fit'),
      ('mixed_bfloat16', 'ours'),
      ('keras_fit_mixed_bfloat16', 'keras_fit'), ('rewrite', 'ours')]
  assert compare.child_command(runs[1], [], 1408)[1:3] == [
      '-m', 'launch.keras_fit']
  assert compare.child_command(runs[0], [], 1408)[1:3] == [
      '-m', 'launch.train']
  metrics = {
      'float32': _metrics('float32', 0, 100, 0.90),
      'keras_fit_float32': dict(_metrics('float32', 0, 80, 0.88),
                                trainer='keras_fit'),
      'mixed_bfloat16': _metrics('mixed_bfloat16', 0, 150, 0.91),
      'keras_fit_mixed_bfloat16': dict(_metrics('mixed_bfloat16', 0, 60,
                                                0.87), trainer='keras_fit'),
  }
  rows = {row['label']: row for row in
          comparison_report.summarize(runs, metrics, 1408)}
  assert list(rows) == ['float32', "float32, Keras' fit", 'mixed_bfloat16',
                        "mixed_bfloat16, Keras' fit"]
  assert rows['mixed_bfloat16']['speedup'] == pytest.approx(1.5)
  assert rows["mixed_bfloat16, Keras' fit"]['speedup'] == pytest.approx(0.75)
  assert rows['mixed_bfloat16']['of_keras_fit'] == pytest.approx(2.5)
  assert rows['float32']['of_keras_fit'] == pytest.approx(1.25)
  assert rows["float32, Keras' fit"]['of_keras_fit'] is None
  assert comparison_report.initial_weights(runs, metrics) == {0: ['seed0']}


@pytest.mark.slow
def test_keras_fit_trains_beside_the_run(tmp_path, tfds_dir):
  """Both processes train the digits; the table holds each one's rate
  and accuracy, and ours over Keras' fit."""
  root = str(tmp_path / 'fit')
  result = run_compare(*_tiny(root, tfds_dir), '--policies=float32',
                       '--keras_fit')
  assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
  summary = json.load(open(os.path.join(root, 'comparison.json')))
  ours, fit = summary['rows']
  assert fit['label'] == "float32, Keras' fit"
  for row in (ours, fit):
    assert row['images_per_sec'] > 0 and 0 <= row['eval_accuracy'] <= 1
    assert row['total_steps'] == ours['total_steps']
  assert ours['of_keras_fit'] == pytest.approx(
      ours['images_per_sec'] / fit['images_per_sec'])
  assert "| float32, Keras' fit |" in result.stdout
  log = open(os.path.join(root, 'keras_fit_float32', 'train.log')).read()
  assert "(Keras' model.fit)" in log


def _digits_folder(root, per_class):
  """The bundled digits as a folder of class folders of PNG files (the
  layout Keras' image_dataset_from_directory reads), `per_class` each."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from pipeline.data.sources.tfds_set import sklearn_digits  # pylint: disable=g-import-not-at-top
  images, labels, _ = sklearn_digits.splits()['train']
  written = {}
  for image, label in zip(images, labels):
    if written.get(label, 0) == per_class:
      continue
    folder = root / f'digit_{label}'
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).convert('RGB').save(
        folder / f'{written.get(label, 0)}.png')
    written[label] = written.get(label, 0) + 1
  return root


@pytest.mark.slow  # Two whole runs of B0: CI's slow tier.
def test_the_race_against_keras_ends_in_its_line(tmp_path):
  """The bundled digits as a folder, at a tiny size: the Keras example's
  code at 32 px and this project's defaults, each evaluated each epoch on
  the same held-out images, end in the one line and comparison.json."""
  folder = _digits_folder(tmp_path / 'digits', per_class=24)
  root = tmp_path / 'race'
  result = run_compare('--against=keras', '--config.dataset=image_folder',
                       f'--config.train_dir={folder}', '--config.epochs=2',
                       '--peer_image_size=32', f'--workdir={root}',
                       timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  line = result.stdout.strip().splitlines()[-2]  # Then 'written to ...'.
  assert re.fullmatch(
      r'race against keras: keras best (0\.\d{4}|1\.0000) at \d+ s \(its run '
      r'\d+ s\); ours best (0\.\d{4}|1\.0000) at \d+ s, (reached keras\' best '
      r'at \d+ s \(\d+\.\d\d of its time\)|never reached keras\' best); at '
      r'\d+ s ours \d\.\d{4}, keras \d\.\d{4} \([+-]\d+\.\d points\)', line), (
          line)
  figures = json.loads((root / 'comparison.json').read_text())
  peer, ours = figures['runs']['keras'], figures['runs']['ours']
  # Both evaluated each of the 2 epochs, on the same held-out images.
  assert [epoch for _, epoch, _ in peer['curve']] == [1, 2]
  assert len(ours['curve']) == 2
  held_out = sorted(p.name for p in (root / 'split' / 'eval').rglob('*.png'))
  assert held_out and json.loads((root / 'ours' / 'metrics.json').read_text(
      ))['eval_examples'] == len(held_out)
  assert figures['peer_best'] == max(a for _, _, a in peer['curve'])
  # Ours trained as the data decide: the 8 px digits at 32 px, mirrored
  # crops (a folder of images is taken for photographs).
  resolved = json.loads((root / 'ours' / 'run.json').read_text())['resolved']
  assert (resolved['image_size'], resolved['augment']) == (32, 'inception')
