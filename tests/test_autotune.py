"""XLA's convolution picks saved once and loaded by every later process
(pipeline/rules/speed/autotune.py), read from what an H200 wrote: its
autotuner's results (jax 0.11.2, `entries` keyed by fingerprints) and the
cuDNN convolutions of B0's compiled step (tests/fixtures/h200/). No GPU
here: the run's side is tested up to XLA_FLAGS and the cache's folder."""

import os
import re
import shutil

import pytest

from conftest import REPO
from pipeline.rules.speed import autotune

FIXTURES = os.path.join(REPO, 'tests', 'fixtures', 'h200')
DUMP = os.path.join(FIXTURES, 'autotune_dump.textproto')
CARD, SOFTWARE = 'NVIDIA H200', 'jax-0.11.2-cudnn-9.19.0.56'


def _compiled():
  with open(os.path.join(FIXTURES, 'step_convolutions.hlo.txt'),
            encoding='utf-8') as f:
    return f.read()


def test_the_comparison_reads_a_gpus_compiled_program():
  """B0's step on an H200: 146 cuDNN convolutions of 73 kinds, each with
  its algorithm; the same program agrees with itself, one convolution
  given another algorithm is counted, and one the saved steps never
  compiled is counted apart."""
  text = _compiled()
  found = autotune.compiled_convolutions(text)
  assert (len(found), sum(map(len, found.values()))) == (73, 146)
  assert all(a and a.startswith('algo ') for v in found.values() for a in v)
  assert autotune.differing_picks(text, found) == {
      'compared': 146, 'differ': 0, 'unsaved': 0}
  first = next(line for line in text.splitlines() if 'size=3x3 stride=2x2'
               in line)  # The stem's, once in the step.
  other = re.sub(r'"algo_id":"\d+"', '"algo_id":"999"', first)
  assert autotune.differing_picks(text.replace(first, other), found) == {
      'compared': 146, 'differ': 1, 'unsaved': 0}
  unseen = first.replace('bf16[256,112,112,32]', 'bf16[256,114,114,32]')
  assert autotune.differing_picks(text.replace(first, unseen), found) == {
      'compared': 145, 'differ': 0, 'unsaved': 1}
  line = autotune.picks_line({'compared': 145, 'differ': 1, 'unsaved': 1},
                             '/p.textproto')
  assert line == ('Kernel picks: 1 of 145 convolutions differ from the '
                  'saved picks (/p.textproto); 1 had none saved and were '
                  'autotuned here')


def test_saved_picks_merge_into_one_file_named_by_its_hash(tmp_path,
                                                          monkeypatch):
  """Two steps' results in one file; the same picks give the same name,
  new picks another; every entry of the H200's file kept whole."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  text = open(DUMP, encoding='utf-8').read()
  header, entries = autotune.blocks(text)
  assert not header and len(entries) == 20
  assert sum('backend: CUDNN' in b for b in entries.values()) == 12
  convolutions = autotune.compiled_convolutions(_compiled())
  autotune.save(DUMP, CARD, SOFTWARE, 'b0-224', convolutions)
  first, skipped = autotune.merged(CARD, SOFTWARE)
  assert not skipped
  assert os.path.basename(first) == f'{autotune.digest_of(first)}.textproto'
  assert autotune.blocks(open(first, encoding='utf-8').read())[1] == entries
  assert autotune.saved_convolutions(first) == convolutions
  assert autotune.merged(CARD, SOFTWARE)[0] == first  # The same picks.
  # Another step's: one entry of its own.
  extra = tmp_path / 'other.textproto'
  key = next(iter(entries))
  extra.write_text(entries[key].replace(
      re.search(r'hlo_fingerprint: "(\w+)"', key).group(1), 'f' * 32) + '\n')
  autotune.save(str(extra), CARD, SOFTWARE, 'b0-128', {})
  second, _ = autotune.merged(CARD, SOFTWARE)
  assert second != first
  assert len(autotune.blocks(open(second, encoding='utf-8').read())[1]) == 21


def test_picks_written_under_other_software_are_never_passed(tmp_path,
                                                            monkeypatch):
  """XLA refuses another version's results and fails the compile: a file
  saved under other software (copied into this one's folder) is passed
  over with a line naming it, and nothing is loaded."""
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  saved = autotune.save(DUMP, CARD, 'jax-0.11.1-cudnn-9.19.0.56', 'b0-224',
                        {})
  ours = autotune.folder(CARD, SOFTWARE)
  os.makedirs(ours)
  for name in os.listdir(os.path.dirname(saved)):
    shutil.copy(os.path.join(os.path.dirname(saved), name), ours)
  path, skipped = autotune.merged(CARD, SOFTWARE)
  assert path is None
  assert len(skipped) == 1 and 'jax-0.11.1-cudnn-9.19.0.56, not ' \
      f'{SOFTWARE}: passed over' in skipped[0]
  assert autotune.merged(CARD, 'jax-0.11.1-cudnn-9.19.0.56')[0]


def test_a_file_without_results_is_not_kept(tmp_path):
  empty = tmp_path / 'autotune.textproto'
  empty.write_text('')
  with pytest.raises(ValueError, match='holds no autotune results'):
    autotune.save(str(empty), CARD, SOFTWARE, 'b0-224', {})


def test_a_run_loads_the_picks_before_its_framework_and_its_cache_names_them(
    tmp_path, monkeypatch):
  """environment.prepare's two steps on a GPU (the driver's list stood in
  for): XLA_FLAGS gain the merged file, a user's own flags kept; the
  compile cache's folder names the file's hash, so new picks are never
  served a program compiled under the old; without a GPU nothing."""
  from pipeline.run import environment  # pylint: disable=g-import-not-at-top
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  software = backends.chosen()[0].software()
  autotune.save(DUMP, CARD, software, 'b0-224', {})
  environ = {'XLA_FLAGS': '--xla_gpu_autotune_level=4'}
  path = environment.prepare_autotune(environ, gpus=[CARD])
  assert environ['XLA_FLAGS'] == (
      f'--xla_gpu_autotune_level=4 {autotune.LOAD_FLAG}={path}')
  assert autotune.loaded() == path
  folder = environment.prepare_compile_cache(
      '', {}, gpus=[CARD], software=software, picks=path).directory
  assert f'-picks-{autotune.digest_of(path)}' in folder
  other = tmp_path / 'other.textproto'
  other.write_text(open(DUMP, encoding='utf-8').read().replace(
      'algo_id: 58', 'algo_id: 59'))
  autotune.save(str(other), CARD, software, 'b0-224', {})
  newer = environment.prepare_autotune({}, gpus=[CARD])
  assert newer != path and environment.prepare_compile_cache(
      '', {}, gpus=[CARD], software=software, picks=newer).directory != folder
  # A user's own file stands; no GPU, no picks.
  own = {'XLA_FLAGS': f'{autotune.LOAD_FLAG}=/mine.textproto'}
  assert environment.prepare_autotune(own, gpus=[CARD]) is None
  assert own['XLA_FLAGS'] == f'{autotune.LOAD_FLAG}=/mine.textproto'
  assert environment.prepare_autotune({}, gpus=[]) is None
