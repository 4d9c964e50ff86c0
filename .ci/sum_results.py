"""Adds up the JUnit XML files pytest wrote for each tier of .ci/run into
the closing lines CI reads, writes every test's duration, and fails the
run unless every test ran or skipped as expected, in time:

  ci: tier fast 12:03, tpu 4:46, ...
  ci: the ten slowest: ...
  ci: skipped for time: N (...)            a skip for time fails the run
  ci: unexpected skips: N (...)            so does any skip not listed in
                                           .ci/expected_skips for its tier
  ci: the run took M:SS of 85:00           longer fails it
  ci: N passed, N failed, N skipped (N as expected)

A tier cut short before pytest finished its file (a full disk, a kill), a
tier whose every test skipped, a failed test, a skip for time, a skip the
environment was not expected to have (a failed apt-get, a broken import)
and a run longer than LIMIT_S each fail it. Durations of every test go to
RESULTS/durations.txt, slowest first.

  python3 .ci/sum_results.py RESULTS [EXPECTED_SKIPS] [STARTED_AT_UNIX_TIME]
"""

import fnmatch
import glob
import os
import sys
import time
import xml.etree.ElementTree as ET

# What tests/conftest.py says of a test that would start past the deadline.
FOR_TIME = 'CI time budget spent'
# From the run's first line: CI's own limit is 90 minutes; a run past 85
# fails here, readable, before CI would cut it off (the aim is 60).
LIMIT_S = 5100
SLOWEST = 10


def expected_skips(path):
  """[(tier, test id glob, words its reason holds)] of the file: a line per
  skip, `TIER | TEST ID (glob) | REASON`; '#' starts a comment."""
  rules = []
  if not path or not os.path.exists(path):
    return rules
  with open(path, encoding='utf-8') as f:
    for line in f:
      line = line.split('#', 1)[0].strip()
      if line:
        tier, test, reason = (part.strip() for part in line.split('|', 2))
        rules.append((tier, test, reason))
  return rules


def test_id(case):
  """tests/test_x.py::test_y, or the module for a module skipped whole."""
  classname, name = case.get('classname', ''), case.get('name', '')
  if not classname:  # A module that skipped at collection.
    return name.replace('.', '/') + '.py'
  return f"{classname.replace('.', '/')}.py::{name}"


def _clock(seconds):
  return f'{int(seconds) // 60}:{int(seconds) % 60:02d}'


def summarize(results, rules, started):
  """(closing lines, whether the run passed)."""
  lines, failed, problems = [], 0, []
  counts = dict(tests=0, skipped=0, expected=0)
  for_time, unexpected, durations, tiers = [], [], [], []
  for path in sorted(glob.glob(f'{results}/*.xml')):
    tier = os.path.basename(path)[:-len('.xml')]
    try:
      root = ET.parse(path).getroot()
    except ET.ParseError as error:
      problems.append(f'ci: {path} is empty or damaged ({error}): that tier '
                      'did not finish')
      failed += 1
      continue
    cases = list(root.iter('testcase'))
    tier_s = sum(float(case.get('time', 0)) for case in cases)
    tiers.append(f'{tier} {_clock(tier_s)}')
    skipped = 0
    for case in cases:
      counts['tests'] += 1
      case_id = test_id(case)
      durations.append((float(case.get('time', 0)), tier, case_id))
      if case.find('failure') is not None or case.find('error') is not None:
        failed += 1
        continue
      skip = case.find('skipped')
      if skip is None:
        continue
      skipped += 1
      counts['skipped'] += 1
      # A module skipped whole says why in the element's text.
      reason = f"{skip.get('message', '')} {skip.text or ''}".strip()
      if FOR_TIME in reason:
        for_time.append(case_id)
      elif any(tier == rule_tier and fnmatch.fnmatch(case_id, test)
               and words in reason for rule_tier, test, words in rules):
        counts['expected'] += 1
      else:
        unexpected.append(f'{tier}: {case_id} ({reason[:160]})')
    if cases and skipped == len(cases):
      problems.append(f'ci: the {tier} tier ran no test ({skipped} '
                      'skipped): its environment is broken or its tests are '
                      'not found')
      failed += 1
  durations.sort(key=lambda row: (-row[0], row[1], row[2]))
  with open(os.path.join(results, 'durations.txt'), 'w',
            encoding='utf-8') as f:
    f.writelines(f'{seconds:8.1f}  {tier:6}  {case_id}\n'
                 for seconds, tier, case_id in durations)
  lines.append(f'ci: tiers (their tests\' own time, summed): '
               f'{", ".join(tiers)}')
  lines.append('ci: the ten slowest: ' + '; '.join(
      f'{case_id} ({tier}) {seconds:.0f} s'
      for seconds, tier, case_id in durations[:SLOWEST]))
  lines.extend(problems)
  lines.append(f'ci: skipped for time: {len(for_time)}'
               + (f' ({", ".join(for_time)})' if for_time else ''))
  lines.append(f'ci: unexpected skips: {len(unexpected)}'
               + (f' ({"; ".join(unexpected)})' if unexpected else ''))
  over = False
  if started is not None:
    took = time.time() - started
    over = took > LIMIT_S
    lines.append(f'ci: the run took {_clock(took)} of {_clock(LIMIT_S)}'
                 + (': over the limit' if over else ''))
  bad = failed + len(for_time) + len(unexpected) + over
  passed = counts['tests'] - failed - counts['skipped']
  lines.append(f'ci: {passed} passed, {failed} failed, {counts["skipped"]} '
               f'skipped ({counts["expected"]} as expected, {len(for_time)} '
               f'for time, {len(unexpected)} unexpected)')
  return lines, not bad


def main(argv):
  results = argv[1]
  rules = expected_skips(argv[2] if len(argv) > 2 else None)
  started = float(argv[3]) if len(argv) > 3 else None
  lines, passed = summarize(results, rules, started)
  print('\n'.join(lines))
  return 0 if passed else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv))
