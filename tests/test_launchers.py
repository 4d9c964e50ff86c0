"""Every launcher's flags are one --helpshort away: each `launch.*`
command lists its own flags and those it takes from launch/cli.py; and
--print_config prints the resolved config as a file --config takes back,
which resolves to the same plan."""

import json
import os
import re

import pytest

from conftest import REPO, run_module, run_train

LAUNCHERS = sorted(name[:-3] for name in os.listdir(os.path.join(REPO,
                                                                 'launch'))
                   if name.endswith('.py') and name not in ('__init__.py',
                                                            'cli.py'))


def _flags_by_module(text):
  """{module: [--flag, ...]} of absl's --helpfull."""
  found, module = {}, None
  for line in text.splitlines():
    if re.match(r'^\S.*:$', line):
      module = line[:-1]
    elif module and re.match(r'^  --', line):
      found.setdefault(module, []).append(
          re.match(r'^  --(?:\[no\])?([\w.]+)', line).group(1))
  return found


def test_every_launcher_is_listed():
  assert {'train', 'evaluate', 'predict', 'compare', 'benchmark',
          'make_tfrecords', 'probe'} <= set(LAUNCHERS)


@pytest.mark.parametrize('launcher', LAUNCHERS)
def test_helpshort_lists_every_flag_the_launcher_takes(launcher):
  full = run_module(f'launch.{launcher}', '--helpfull', timeout=300)
  by_module = _flags_by_module(full.stdout)
  own = [flags for module, flags in by_module.items()
         if module.endswith(f'launch/{launcher}.py') or
         module == f'launch.{launcher}']
  shared = by_module.get('launch.cli', [])
  expected = {flag for flags in own for flag in flags} | set(shared)
  assert own and expected, full.stdout[-2000:]
  short = run_module(f'launch.{launcher}', '--helpshort', timeout=300)
  listed = {re.match(r'^  --(?:\[no\])?([\w.]+)', line).group(1)
            for line in short.stdout.splitlines()
            if re.match(r'^  --', line)}
  assert expected <= listed, sorted(expected - listed)


def test_a_printed_config_passed_back_resolves_to_the_same_plan(tmp_path,
                                                                tfds_dir):
  common = (f'--config.data_dir={tfds_dir}', '--config.epochs=3',
            '--config.model=efficientnet_tiny')
  printed = run_train(*common, '--print_config',
                      f'--workdir={tmp_path / "a"}', timeout=300)
  assert printed.returncode == 0, printed.stderr[-2000:]
  assert not os.path.exists(tmp_path / 'a')  # Nothing written.
  path = tmp_path / 'resolved.py'
  path.write_text(printed.stdout)
  text = printed.stdout
  # What the config left open, filled with what the data chose, and why.
  assert re.search(r"config\.image_size = 32  # Left open: the data: 8x8 "
                   r'images', text), text
  assert ("config.augment = 'translate'  # Left open: sklearn_digits holds "
          'digits or letters') in text
  plans = []
  for name, args in (('a', common), ('b', (f'--config={path}',))):
    result = run_train(*args, '--dry_run', f'--workdir={tmp_path / name}',
                       timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    plans.append([re.sub(r'\([^()]*(\([^()]*\)[^()]*)*\)', '', line.split(
        ' ', 1)[1]) for line in result.stderr.splitlines()
                  if re.match(r'\d\d:\d\d:\d\d (Data|Input|Batch|Precision|'
                              r'Recipe|XLA):', line)])
  # The same sizes, steps, augmentation, batch, policy and recipe; only the
  # reasons (in parentheses) differ: given now, not left open.
  assert plans[0] == plans[1] and len(plans[0]) == 6, plans
