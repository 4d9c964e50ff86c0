"""Adds up the JUnit XML files pytest wrote for each tier of .ci/run into
the closing lines CI reads, and fails the run where a tier did not test:

  ci: skipped for time: N (tests/test_x.py::test_y, ...)
  ci: N passed, N failed, N skipped (N for time, N by environment)

A tier cut short before pytest finished its file (a full disk, a kill), and
a tier whose every test skipped and none for time (JAX that does not import,
a module that skipped whole), count as one failure each and are named, so the closing
line never reads green for them. Exits 1 where anything failed."""

import glob
import os
import sys
import xml.etree.ElementTree as ET

# What tests/conftest.py says of a test that would start past the deadline.
FOR_TIME = 'CI time budget spent'

counts = dict(tests=0, failures=0, errors=0, skipped=0)
for_time = []
for path in sorted(glob.glob(f'{sys.argv[1]}/*.xml')):
  tier = os.path.basename(path)[:-len('.xml')]
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as error:
    print(f'ci: {path} is empty or damaged ({error}): that tier did not finish')
    counts['tests'] += 1
    counts['errors'] += 1
    continue
  suites = [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))
  tier_counts = {key: sum(int(suite.get(key, 0)) for suite in suites)
                 for key in counts}
  for key in counts:
    counts[key] += tier_counts[key]
  tier_for_time = 0
  for case in root.iter('testcase'):
    skipped = case.find('skipped')
    if skipped is not None and FOR_TIME in skipped.get('message', ''):
      tier_for_time += 1
      for_time.append(f"{case.get('classname', '').replace('.', '/')}.py::"
                      f"{case.get('name')}")
  # Every test skipped and none for time: the deadline did not skip the
  # tier (its own skips for another backend do not count against it then).
  if tier_counts['tests'] == tier_counts['skipped'] and not tier_for_time:
    print(f'ci: the {tier} tier ran no test ({tier_counts["tests"]} '
          'skipped): its environment is broken or its tests are not found')
    counts['tests'] += 1
    counts['errors'] += 1
failed = counts['failures'] + counts['errors']
passed = counts['tests'] - failed - counts['skipped']
print(f'ci: skipped for time: {len(for_time)}'
      + (f' ({", ".join(for_time)})' if for_time else ''))
print(f'ci: {passed} passed, {failed} failed, {counts["skipped"]} skipped '
      f'({len(for_time)} for time, {counts["skipped"] - len(for_time)} by '
      'environment)')
sys.exit(1 if failed else 0)
