"""The design's rules, read from the source: one backend seam, no import
circle, modules and functions a reader can hold in mind."""

import ast
import collections
import os
import re

import pytest

from conftest import REPO

PIPELINE = os.path.join(REPO, 'pipeline')
BACKEND_PACKAGES = ('pipeline.backends.tensorflow', 'pipeline.backends.jax')
MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 90


def _modules():
  """{dotted name: path} of every module under pipeline/ and launch/."""
  found = {}
  for top in ('pipeline', 'launch'):
    for folder, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
          found[dotted.removesuffix('.__init__')] = path
  return found


MODULES = _modules()


def _imports(path):
  """The pipeline modules `path` imports (a package's __init__ where a
  name is not a module), wherever the import statement stands."""
  names = set()
  for node in ast.walk(ast.parse(open(path, encoding='utf-8').read())):
    if isinstance(node, ast.ImportFrom) and node.module:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        names.add(full if full in MODULES else node.module)
    elif isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
  return {name for name in names if name in MODULES}


def _backend_package(module):
  return next((p for p in BACKEND_PACKAGES
               if module == p or module.startswith(p + '.')), None)


def test_only_a_backend_imports_its_own_package():
  """Everything else reaches a backend through plan.backend, and the two
  backends never import each other."""
  wrong = []
  for module, path in MODULES.items():
    own = _backend_package(module)
    for imported in _imports(path):
      theirs = _backend_package(imported)
      if theirs and theirs != own:
        wrong.append(f'{module} imports {imported}')
  assert not wrong


def test_no_import_circle():
  graph = {module: _imports(path) for module, path in MODULES.items()}
  assert sum(map(len, graph.values())) > 150  # The imports were read.
  state, circles = {}, []

  def visit(module, path):
    state[module] = 'open'
    for imported in sorted(graph[module]):
      if state.get(imported) == 'open':
        circles.append(' -> '.join(path[path.index(imported):] + [imported]))
      elif imported not in state:
        visit(imported, path + [imported])
    state[module] = 'done'

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])
  assert not circles


def test_nothing_outside_the_backends_asks_which_backend_runs():
  asks = re.compile(r"""==\s*['"](jax|tensorflow)['"]|!=\s*['"](jax|tensorflow)"""
                    r"""['"]|keras\.backend\.backend\(\)|hasattr\([^)]*strategy""")
  found = [f'{module}: {line.strip()}' for module, path in MODULES.items()
           if not module.startswith('pipeline.backends')
           for line in open(path, encoding='utf-8') if asks.search(line)]
  assert not found


@pytest.mark.parametrize('module', sorted(MODULES))
def test_modules_and_functions_stay_readable(module):
  text = open(MODULES[module], encoding='utf-8').read()
  assert len(text.splitlines()) <= MAX_MODULE_LINES
  long = [f'{node.name}: {node.end_lineno - node.lineno + 1} lines'
          for node in ast.walk(ast.parse(text))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
  assert not long


def test_every_package_says_what_lives_there():
  packages = [m for m, p in MODULES.items() if p.endswith('__init__.py')
              and m.startswith('pipeline')]
  undocumented = [m for m in packages
                  if not ast.get_docstring(ast.parse(open(MODULES[m]).read()))]
  assert len(packages) >= 8 and not undocumented


def test_the_backends_package_loads_without_tensorflow_jax_or_keras():
  """The backend is chosen, and the compile cache set up, before Keras and
  TensorFlow load (they read KERAS_BACKEND and XLA's flags once)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  loaded = subprocess.run(
      [sys.executable, '-c',
       'import sys\nfrom pipeline import backends\nfrom pipeline.run import '
       'compile_cache\nfor name in backends.BACKENDS[1:]:\n'
       '  backends.load(name).software()\n'
       "print(sorted({m.split('.')[0] for m in sys.modules} & "
       "{'tensorflow', 'jax', 'keras'}))"],
      cwd=REPO, capture_output=True, text=True, check=True).stdout
  assert loaded.strip() == '[]'


def test_the_tree_shows_the_roles():
  folders = collections.Counter(
      m.split('.')[1] for m in MODULES if m.startswith('pipeline.')
      and m.count('.') >= 2)
  assert set(folders) == {'backends', 'data', 'reports', 'run', 'storage',
                          'training'}
  flat = [m for m in MODULES if m.startswith('pipeline.') and m.count('.') == 1
          and m not in ('pipeline.errors', 'pipeline.backends', 'pipeline.data',
                        'pipeline.reports', 'pipeline.run', 'pipeline.storage',
                        'pipeline.training')]
  assert not flat


def test_both_backends_implement_the_whole_interface():
  """backends/interface.py is what the rest of the library calls: every
  member it declares exists on both backends, with the same parameters."""
  import inspect  # pylint: disable=g-import-not-at-top
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  from pipeline.backends import interface  # pylint: disable=g-import-not-at-top
  declared = {name: member for name, member in vars(interface.Backend).items()
              if not name.startswith('_')}
  declared.update(dict.fromkeys(interface.Backend.__annotations__))
  assert len(declared) >= 12
  for name in backends.BACKENDS[1:]:
    backend = backends.load(name)
    for member, function in declared.items():
      assert hasattr(backend, member), (name, member)
      if callable(function):
        assert (list(inspect.signature(getattr(backend, member)).parameters)
                == list(inspect.signature(function).parameters)[1:]), (
                    name, member)
