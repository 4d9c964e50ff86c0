"""The README is the front door and docs/ holds the rest, by task: the
README stays short, every page is linked and every link resolves, and
every launcher command they show names flags its launcher defines,
config keys configs/default.py has and config files that exist (read
from the sources: no launcher is imported)."""

import os
import re

import pytest

from conftest import REPO

README = os.path.join(REPO, 'README.md')
DOCS = os.path.join(REPO, 'docs')
PAGES = sorted(os.path.join(DOCS, name) for name in os.listdir(DOCS)
               if name.endswith('.md'))
# Flags absl defines in every program.
ABSL = {'verbosity', 'v', 'logtostderr', 'alsologtostderr', 'helpfull',
        'help', 'flagfile', 'undefok'}


def _text(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


def _defined_flags(launcher):
  """The flags `launch/<launcher>.py` defines, with launch/cli.py's where
  it imports it."""
  source = _text(os.path.join(REPO, 'launch', f'{launcher}.py'))
  if 'from launch import cli' in source:
    source += _text(os.path.join(REPO, 'launch', 'cli.py'))
  names = set(re.findall(
      r"(?:DEFINE_\w+|define_policy_list)\(\s*'(\w+)'", source))
  # Booleans take --no<name> too.
  return names | {f'no{name}' for name in names} | ABSL


def _config_keys():
  from configs import default  # pylint: disable=g-import-not-at-top
  return set(default.get_config())


def _commands(text):
  """Every `python -m launch.X ...` command of the page's code, its
  backslash-continued lines joined; (launcher, its arguments)."""
  joined = re.sub(r'\\\n\s*', ' ', text)
  found = []
  for line in joined.splitlines():
    for match in re.finditer(r'python3? -m launch\.(\w+)((?: [^#`\n]*)?)',
                             line):
      arguments = match.group(2).split(' -- ')[0]  # launch.pod's trainer's.
      found.append((match.group(1), arguments))
  return found


def test_the_readme_is_a_front_door():
  text = _text(README)
  assert len(text.splitlines()) <= 250
  # Its two commands first: the main job offline, then the tests.
  commands = [line.strip() for line in text.splitlines()[:15]
              if line.startswith('    python3 -m venv')]
  assert commands[0].endswith('.venv/bin/python -m launch.train')
  assert commands[1].endswith('.venv/bin/python -m pytest')
  for page in PAGES:
    assert f'](docs/{os.path.basename(page)})' in text, page


@pytest.mark.parametrize('path', [README, *PAGES],
                         ids=lambda path: os.path.relpath(path, REPO))
def test_every_link_resolves(path):
  for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', _text(path)):
    if target.startswith(('http://', 'https://')):
      continue
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    assert os.path.exists(resolved), target


@pytest.mark.parametrize('path', [README, *PAGES],
                         ids=lambda path: os.path.relpath(path, REPO))
def test_every_command_names_what_exists(path):
  keys = _config_keys()
  commands = _commands(_text(path))
  for launcher, arguments in commands:
    assert os.path.exists(os.path.join(REPO, 'launch', f'{launcher}.py')), (
        launcher)
    defined = _defined_flags(launcher)
    for flag, value in re.findall(r'--([\w.]+)(?:=(\S+))?', arguments):
      if flag.startswith('config.'):
        assert flag[len('config.'):] in keys, (launcher, flag)
      else:
        assert flag in defined, (launcher, flag)
      if flag == 'config' and value and value.startswith('configs/'):
        assert os.path.exists(os.path.join(REPO, value)), value


def test_the_command_check_finds_what_does_not_exist():
  keys = _config_keys()
  [(launcher, arguments)] = _commands(
      '    python -m launch.train --tpu=local \\\n'
      '        --config.epoch=5 --polcy=auto\n')
  assert launcher == 'train'
  flags = dict(re.findall(r'--([\w.]+)(?:=(\S+))?', arguments))
  assert 'epoch' not in keys and 'polcy' not in _defined_flags('train')
  assert 'tpu' in _defined_flags('train') and set(flags) == {
      'tpu', 'config.epoch', 'polcy'}
