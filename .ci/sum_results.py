"""Adds up the JUnit XML files pytest wrote for each tier of .ci/run into
the closing line CI reads: 'ci: N passed, N failed, N skipped'. A tier cut
short before pytest finished its file (a full disk, a kill) counts as one
failure and is named, so the closing line never reads green for it."""

import glob
import sys
import xml.etree.ElementTree as ET

counts = dict(tests=0, failures=0, errors=0, skipped=0)
for path in sorted(glob.glob(f'{sys.argv[1]}/*.xml')):
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as error:
    print(f'ci: {path} is empty or damaged ({error}): that tier did not finish')
    counts['tests'] += 1
    counts['errors'] += 1
    continue
  for suite in ([root] if root.tag == 'testsuite' else root.iter('testsuite')):
    for key in counts:
      counts[key] += int(suite.get(key, 0))
failed = counts['failures'] + counts['errors']
passed = counts['tests'] - failed - counts['skipped']
print(f'ci: {passed} passed, {failed} failed, {counts["skipped"]} skipped')
