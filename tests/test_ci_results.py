"""CI's closing lines (.ci/sum_results.py) over JUnit files as pytest writes
them: only a run where every test passed or skipped as its environment is
expected to (.ci/expected_skips), none for time, within its limit, passes;
every test's duration is written and the slowest named."""

import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOR_TIME = 'CI time budget spent (PIPELINE_TEST_DEADLINE)'
EXPECTED = """# tier | test (glob) | what its reason says
fast | tests/test_x.py::test_jax_* | needs JAX
slow | tests/test_jax_module.py | could not import 'jax'
"""


def _tier(path, *cases, module_skipped=''):
  """A JUnit file of (name, outcome, message, seconds) cases as pytest
  writes it, and a module skipped whole at collection if named."""
  rows = []
  for name, outcome, message, seconds in cases:
    inner = {'passed': '',
             'failed': f'<failure message="{message}"/>',
             'skipped': f'<skipped type="pytest.skip" message="{message}"/>'}
    rows.append(f'<testcase classname="tests.test_x" name="{name}" '
                f'time="{seconds}">{inner[outcome]}</testcase>')
  if module_skipped:
    rows.append(f'<testcase classname="" name="{module_skipped}" time="0">'
                '<skipped message="collection skipped">'
                "('/repo/tests/test_jax_module.py', 19, 'Skipped: could not "
                "import &apos;jax&apos;: No module named &apos;jax&apos;')"
                '</skipped></testcase>')
  path.write_text(
      '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite '
      f'name="pytest" tests="{len(rows)}">' + ''.join(rows) +
      '</testsuite></testsuites>')


def _sum(folder, started=None):
  (folder / 'expected_skips').write_text(EXPECTED)
  return subprocess.run(
      [sys.executable, os.path.join(REPO, '.ci', 'sum_results.py'),
       str(folder), str(folder / 'expected_skips'),
       str(started or time.time() - 125)],
      capture_output=True, text=True, check=False)


def _green(folder):
  _tier(folder / 'fast.xml', ('test_a', 'passed', '', 3.0),
        ('test_jax_b', 'skipped', 'needs JAX here', 0.0))
  _tier(folder / 'slow.xml', ('test_c', 'passed', '', 40.0),
        ('test_d', 'passed', '', 7.5),
        module_skipped='tests.test_jax_module')


def test_a_run_whose_skips_are_all_expected_passes_and_says_where_time_went(
    tmp_path):
  _green(tmp_path)
  result = _sum(tmp_path)
  assert result.returncode == 0, result.stdout
  lines = result.stdout.splitlines()
  assert lines[0] == ("ci: tiers (their tests' own time, summed): fast 0:03, "
                      'slow 0:47')
  assert lines[1] == ('ci: the ten slowest: tests/test_x.py::test_c (slow) '
                      '40 s; tests/test_x.py::test_d (slow) 8 s; '
                      'tests/test_x.py::test_a (fast) 3 s; '
                      'tests/test_x.py::test_jax_b (fast) 0 s; '
                      'tests/test_jax_module.py (slow) 0 s')
  assert 'ci: skipped for time: 0' in lines
  assert 'ci: unexpected skips: 0' in lines
  assert lines[-2].startswith('ci: the run took 2:0')
  assert lines[-1] == ('ci: 3 passed, 0 failed, 2 skipped (2 as expected, 0 '
                       'for time, 0 unexpected)')
  durations = (tmp_path / 'durations.txt').read_text().splitlines()
  assert durations[0].split() == ['40.0', 'slow', 'tests/test_x.py::test_c']
  assert len(durations) == 5


def test_a_skip_for_time_fails_the_run(tmp_path):
  _green(tmp_path)
  _tier(tmp_path / 'slow.xml', ('test_c', 'passed', '', 40.0),
        ('test_d', 'skipped', FOR_TIME, 0.0),
        module_skipped='tests.test_jax_module')
  result = _sum(tmp_path)
  assert result.returncode == 1
  assert 'ci: skipped for time: 1 (tests/test_x.py::test_d)' in (
      result.stdout.splitlines())


@pytest.mark.parametrize('reason', [
    'apt-get could not install Slurm',  # A reason no line expects.
    'needs JAX here',  # An expected reason, but in another tier.
])
def test_an_unexpected_skip_fails_the_run_with_its_reason(tmp_path, reason):
  _green(tmp_path)
  _tier(tmp_path / 'slow.xml', ('test_c', 'passed', '', 40.0),
        ('test_jax_e', 'skipped', reason, 0.0),
        module_skipped='tests.test_jax_module')
  result = _sum(tmp_path)
  assert result.returncode == 1
  assert (f'ci: unexpected skips: 1 (slow: tests/test_x.py::test_jax_e '
          f'({reason}))') in result.stdout.splitlines()


def test_a_run_longer_than_its_limit_fails(tmp_path):
  _green(tmp_path)
  result = _sum(tmp_path, started=time.time() - 5161)
  assert result.returncode == 1
  assert 'ci: the run took 86:01 of 85:00: over the limit' in (
      result.stdout.splitlines())


@pytest.mark.parametrize('slow_xml, said', [
    # Every test skipped: JAX that does not import.
    ('skipped', 'the slow tier ran no test (2 skipped)'),
    ('failed', 'ci: 1 passed, 1 failed'),
    ('cut short', 'that tier did not finish'),
])
def test_what_did_not_test_fails_the_run(slow_xml, said, tmp_path):
  _tier(tmp_path / 'fast.xml', ('test_a', 'passed', '', 1.0))
  if slow_xml == 'cut short':
    (tmp_path / 'slow.xml').write_text('<?xml version="1.0"?><testsuites')
  elif slow_xml == 'skipped':
    _tier(tmp_path / 'slow.xml', ('test_b', 'skipped', 'no module jax', 0),
          ('test_c', 'skipped', 'no module jax', 0))
  else:
    _tier(tmp_path / 'slow.xml', ('test_b', 'failed', 'assert 0', 1.0))
  result = _sum(tmp_path)
  assert result.returncode == 1
  assert said in result.stdout, result.stdout


def test_the_expected_skips_file_parses_and_names_real_tests():
  """Each line of .ci/expected_skips names a tier .ci/run writes and a
  test module that exists."""
  sys.path.insert(0, os.path.join(REPO, '.ci'))
  try:
    import sum_results  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  rules = sum_results.expected_skips(os.path.join(REPO, '.ci',
                                                  'expected_skips'))
  assert rules
  with open(os.path.join(REPO, '.ci', 'run'), encoding='utf-8') as f:
    run = f.read()
  for tier, test, reason in rules:
    assert f'$results/{tier}.xml' in run, tier
    assert os.path.exists(os.path.join(REPO, test.split('::')[0])), test
    assert reason, test
