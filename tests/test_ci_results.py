"""CI's closing lines (.ci/sum_results.py) over JUnit files as pytest writes
them: what the deadline skipped is named and does not fail the run; a tier
that tested nothing for another reason, a failure, or a tier cut short
does."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOR_TIME = 'CI time budget spent (PIPELINE_TEST_DEADLINE)'


def _tier(path, *cases):
  """A JUnit file of (name, outcome, message) cases, as pytest writes it."""
  rows = []
  for name, outcome, message in cases:
    inner = {'passed': '',
             'failed': f'<failure message="{message}"/>',
             'skipped': f'<skipped type="pytest.skip" message="{message}"/>'}
    rows.append(f'<testcase classname="tests.test_x" name="{name}" '
                f'time="1.0">{inner[outcome]}</testcase>')
  counts = {outcome: sum(case[1] == outcome for case in cases)
            for outcome in ('failed', 'skipped')}
  path.write_text(
      '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite '
      f'name="pytest" errors="0" failures="{counts["failed"]}" '
      f'skipped="{counts["skipped"]}" tests="{len(cases)}">'
      + ''.join(rows) + '</testsuite></testsuites>')


def _sum(folder):
  return subprocess.run(
      [sys.executable, os.path.join(REPO, '.ci', 'sum_results.py'),
       str(folder)], capture_output=True, text=True, check=False)


def test_a_tier_the_deadline_skipped_is_named_not_failed(tmp_path):
  _tier(tmp_path / 'fast.xml', ('test_a', 'passed', ''))
  # The last tier: all skipped, most for time, one for the other backend.
  _tier(tmp_path / 'slow.xml', ('test_b', 'skipped', FOR_TIME),
        ('test_c', 'skipped', 'TensorFlow only'))
  result = _sum(tmp_path)
  assert result.returncode == 0, result.stdout
  assert 'ci: skipped for time: 1 (tests/test_x.py::test_b)' in result.stdout
  assert result.stdout.endswith(
      'ci: 1 passed, 0 failed, 2 skipped (1 for time, 1 by environment)\n')


@pytest.mark.parametrize('slow_xml, said', [
    # Every test skipped, none for time: JAX that does not import.
    ('skipped', 'the slow tier ran no test (2 skipped)'),
    ('failed', 'ci: 1 passed, 1 failed'),
    ('cut short', 'that tier did not finish'),
])
def test_what_did_not_test_fails_the_run(slow_xml, said, tmp_path):
  _tier(tmp_path / 'fast.xml', ('test_a', 'passed', ''))
  if slow_xml == 'cut short':
    (tmp_path / 'slow.xml').write_text('<?xml version="1.0"?><testsuites')
  elif slow_xml == 'skipped':
    _tier(tmp_path / 'slow.xml', ('test_b', 'skipped', 'no module jax'),
          ('test_c', 'skipped', 'no module jax'))
  else:
    _tier(tmp_path / 'slow.xml', ('test_b', 'failed', 'assert 0'))
  result = _sum(tmp_path)
  assert result.returncode == 1
  assert said in result.stdout, result.stdout
