"""launch.gpu_checks' runner, with stand-in checks (no GPU here): in order,
within the budget, one report after every check."""

import json

from pipeline.reports import gpu_checks

_CHECKS = (
    gpu_checks.Check('passes', 'a quick one', ('timeit', '-n', '1', 'pass'),
                     0),
    gpu_checks.Check('fails', 'reads a file that is not there',
                     ('json.tool', '{out}/missing.json'), 0),
    gpu_checks.Check('writes', 'writes its figures',
                     ('json.tool', '{out}/in.json', '{out}/figures.json'), 0,
                     'figures.json'),
    gpu_checks.Check('overruns', 'sleeps past the budget',
                     ('timeit', '-n', '1', 'import time; time.sleep(60)'), 0),
    gpu_checks.Check('skipped', 'needs more than is left', ('timeit', 'pass'),
                     1000),
)


def test_checks_run_in_order_within_the_budget_into_one_report(tmp_path):
  (tmp_path / 'in.json').write_text('{"images_per_sec": 7632}')
  report = gpu_checks.run(str(tmp_path), budget_s=10, checks=_CHECKS)
  by_name = {entry['name']: entry for entry in report['checks']}
  assert list(by_name) == ['passes', 'fails', 'writes', 'overruns', 'skipped']
  assert by_name['passes']['exit'] == 0
  assert by_name['fails']['exit'] == 2  # argparse's, for a missing file.
  assert 'missing.json' in '\n'.join(by_name['fails']['output_tail'])
  assert by_name['writes']['figures'] == {'images_per_sec': 7632}
  assert by_name['overruns']['cut_off'] == 'stopped at the end of the budget'
  assert report['elapsed_s'] <= 11  # The budget, and the report's writing.
  assert by_name['skipped']['skipped'].endswith('it needs about 1000 s')
  assert json.loads((tmp_path / 'report.json').read_text()) == report
  text = (tmp_path / 'report.txt').read_text()
  assert 'fails: failed with exit 2 in ' in text
  assert 'skipped: skipped (' in text and 'python -m json.tool' in text


def test_the_shipped_checks_run_the_probe_first_and_fit_an_hour():
  names = [check.name for check in gpu_checks.CHECKS]
  assert names[0] == 'probe' and names[1] == 'photos'
  assert sum(check.needs_s for check in gpu_checks.CHECKS) <= 3600
