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


# The repository's code: its configs below every floor of pipeline/, its
# launchers above them.
TOPS = ('configs', 'pipeline', 'launch')


def _modules():
  """{dotted name: path} of every module of the repository's code."""
  found = {}
  for top in TOPS:
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


# The one tool that names a backend: the probe measures the JAX route
# itself, on machines that have nothing else (no TensorFlow to resolve a
# plan with).
NAMES_ITS_BACKEND = ('pipeline.probe', 'pipeline.backends.jax')


def _names_its_backend(module, imported):
  tool, backend = NAMES_ITS_BACKEND
  return ((module == tool or module.startswith(tool + '.')) and
          (imported == backend or imported.startswith(backend + '.')))


def test_only_a_backend_imports_its_own_package():
  """Everything else reaches a backend through plan.backend, and the two
  backends never import each other."""
  wrong = []
  for module, path in MODULES.items():
    own = _backend_package(module)
    for imported in _imports(path):
      theirs = _backend_package(imported)
      if (theirs and theirs != own and
          not _names_its_backend(module, imported)):
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


def test_data_imports_no_backend_and_calls_none():
  """data/ makes the input; the loop hands it to the run's backend, as
  Keras' trainer asks its data adapter for an iterator."""
  calls = re.compile(r'\bbackends?\b\.|from pipeline(\.backends| import '
                     r'backends)')
  found = [f'{module}: {line.strip()}' for module, path in MODULES.items()
           if module.startswith('pipeline.data')
           for line in open(path, encoding='utf-8')
           if calls.search(line) and not line.lstrip().startswith('#')]
  assert not found
  assert calls.search('    return plan.backend.distribute(plan.hardware, x)')


def test_a_sources_keys_are_read_by_its_module_alone():
  """A loaded source carries what it read (its record files, label
  offset, class names): the TFRecord source's keys are read in its package
  only, so a second record-file source touches its package and its
  registration."""
  reads = re.compile(r'(?<![-.\w])config\.(train_files|eval_files|'
                     r'label_offset|num_train_examples|num_eval_examples)\b')
  found = [f'{module}: {line.strip()}' for module, path in MODULES.items()
           if not module.startswith('pipeline.data.sources.tfrecord')
           and not module.startswith('configs')
           for line in open(path, encoding='utf-8') if reads.search(line)]
  assert not found
  assert reads.search('  files = list_files(config.train_files)')
  assert not reads.search("'--config.train_files=GLOB'")


def test_nothing_outside_the_backends_asks_which_backend_runs():
  asks = re.compile(r"""==\s*['"](jax|tensorflow)['"]|!=\s*['"](jax|tensorflow)"""
                    r"""['"]|keras\.backend\.backend\(\)|hasattr\([^)]*strategy""")
  found = [f'{module}: {line.strip()}' for module, path in MODULES.items()
           if not module.startswith('pipeline.backends')
           for line in open(path, encoding='utf-8') if asks.search(line)]
  assert not found


# The modules of the named parts (pipeline/parts.py): each knows its own
# name; every other module asks the part the config names.
KNOWS_ITS_NAME = ('pipeline.parts', 'pipeline.data.augmentations',
                  'pipeline.recipe.layers', 'pipeline.recipe.optimizers',
                  'pipeline.recipe.schedules')
KNOWS_ITS_NAME_IN = ('pipeline.data.sources', 'pipeline.recipe.models')
_SELECTORS = r'(dataset|augment|model|optimizer|lr_schedule|batch_norm|squeeze_excite|depthwise)'


def _named_parts():
  """Every name the tables hold."""
  from pipeline import recipe  # pylint: disable=g-import-not-at-top
  from pipeline.data import augmentations, sources  # pylint: disable=g-import-not-at-top
  return {name for table in (*recipe.tables(), sources.SOURCES,
                             augmentations.AUGMENTATIONS)
          for name in table.names()}


def _asks_which_part(names):
  """A line that compares a part's name: a config key that names a part,
  or a source's name, against anything; a registered name, quoted, against
  anything."""
  quoted = '|'.join(sorted(map(re.escape, names), key=len, reverse=True))
  return re.compile(
      rf"""(config\.{_SELECTORS}|\[['"]{_SELECTORS}['"]\]|source\.name)"""
      r"""\s*(==|!=|\bin\b|\bnot in\b)|"""
      rf"""config\.{_SELECTORS}\.(startswith|endswith)\(|"""
      rf"""['"]({quoted})['"]\s*(==|!=|\bin\b)|"""
      rf"""(==|!=|\bin)\s*\(?['"]({quoted})['"]""")


def test_no_module_compares_a_parts_name_but_its_own():
  asks = _asks_which_part(_named_parts())
  found = [f'{module}: {line.strip()}' for module, path in MODULES.items()
           if module not in KNOWS_ITS_NAME and
           not module.startswith(KNOWS_ITS_NAME_IN)
           for line in open(path, encoding='utf-8') if asks.search(line)]
  assert not found


@pytest.mark.parametrize('line', [
    "  if config.dataset == 'tfrecord':",
    "  if source.name in ('image_folder', 'tfrecord') and",
    "  if 'image_folder' == config.dataset:",
    "  if config.augment.startswith('inception'):",
    "  if kind in ('translate_flip', 'inception', 'inception_randaugment'):",
    "  if name == 'efficientnet_tiny':",
    "  if config['model'] != other:"])
def test_the_part_check_finds_a_comparison(line):
  assert _asks_which_part(_named_parts()).search(line)


# --- Named choices: each vocabulary's words are its owner's alone ---------
#
# A name a table, an enum or an engine owns, spelt as a string elsewhere and
# compared (==, !=, in, a literal tuple or set it is looked for in), made a
# dictionary key or a set's member, or matched with startswith/endswith, is
# a choice travelling as a string: the owner's type or method answers it.


def _vocabularies():
  """(what, its words, the modules that own them) of every vocabulary."""
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  from pipeline.data import cache, input_pipeline, input_spec  # pylint: disable=g-import-not-at-top
  from pipeline.storage import checkpoint_format  # pylint: disable=g-import-not-at-top
  return [
      ('a part', _named_parts(), (*KNOWS_ITS_NAME, *KNOWS_ITS_NAME_IN)),
      ("a cluster engine's display name", ENGINE_NAMES,
       ('pipeline.rules.machine.cluster',)),
      ('an input pipeline', {p.value for p in input_pipeline.Pipeline},
       ('pipeline.data.input_pipeline', 'pipeline.data.dali')),
      ('a cache kind', {k.value for k in cache.Kind} - {'none'},
       ('pipeline.data.cache',)),
      ('a checkpoint format', {f.value for f in checkpoint_format.Format},
       ('pipeline.storage.checkpoint_format',)),
      ('a backend', set(backends.BACKENDS) - {'auto'},
       ('pipeline.backends', NAMES_ITS_BACKEND[0])),
      ('a cache setting', {input_spec.MEMORY}, ('pipeline.data.input_spec',)),
  ]


def _names():
  """(what, its words, the module that owns them) of every vocabulary
  whose words are names, spelled nowhere else at all: the workdir's files,
  the figures a run's evaluation is named by, the trackers."""
  from pipeline.rules.config import validation  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  return [
      ("a workdir's file", set(workdirs.File), 'pipeline.storage.workdirs'),
      ('a metric', set(validation.Metric), 'pipeline.rules.config.validation'),
      ('a tracker', set(validation.Tracker),
       'pipeline.rules.config.validation'),
  ]


def _strings(text):
  """Every string constant in `text` but docstrings (and other bare
  strings standing as statements)."""
  tree = ast.parse(text)
  docstrings = {id(node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)}
  return [node for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and id(node) not in docstrings]


def _spelt_names(text, words):
  """(line, word) of each string in `text`, docstrings aside, that is
  one of `words`."""
  return [(node.lineno, node.value) for node in _strings(text)
          if node.value in words]


def test_no_module_spells_another_modules_name():
  found = [f'{module}:{line}: {word!r} ({what})'
           for what, words, owner in _names()
           for module, path in sorted(MODULES.items()) if module != owner
           for line, word in _spelt_names(open(path, encoding='utf-8').read(),
                                          words)]
  assert not found


@pytest.mark.parametrize('line, word', [
    ("saved = workdir.read_json('run.json')", 'run.json'),
    ("LOG_FILE = 'run.log'", 'run.log'),
    ("if self.metric == 'eval_loss':\n  pass", 'eval_loss'),
    ("print(metrics['eval_accuracy'])", 'eval_accuracy'),
    ("TRACKERS = {'mlflow': MlflowTracker}", 'mlflow'),
    ("  name = 'wandb'", 'wandb'),
])
def test_the_name_check_finds_each_kind_of_use(line, word):
  words = {word for _, found, _ in _names() for word in found}
  assert [w for _, w in _spelt_names(line.strip(), words)] == [word]
  assert not _spelt_names(f'def f():\n  \"\"\"{word}\"\"\"\n', words)


# The engines' names as cluster.py gives them (Cluster.engine).
ENGINE_NAMES = {'Slurm', 'Open MPI', 'Open MPI 4', 'Open MPI 5', 'GKE TPU',
                'XPK'}


def _spelt_choices(text, words):
  """(line, word) of each place `text` uses one of `words` as a choice."""
  found = []

  def strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
      return [e for e in node.elts if isinstance(e, ast.Constant)
              and isinstance(e.value, str)]
    return []

  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.Compare):
      used = [s for side in (node.left, *node.comparators)
              for s in strings(side)]
    elif isinstance(node, ast.Dict):
      used = [k for k in node.keys if k is not None
              and isinstance(k, ast.Constant) and isinstance(k.value, str)]
    elif isinstance(node, ast.Set):
      used = strings(node)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ('startswith', 'endswith')):
      used = [s for arg in node.args for s in strings(arg)]
    else:
      continue
    found += [(s.lineno, s.value) for s in used if s.value in words]
  return found


def test_no_module_spells_another_modules_choice():
  found = [f'{module}:{line}: {word!r} ({what})'
           for what, words, owners in _vocabularies()
           for module, path in sorted(MODULES.items())
           if not module.startswith(owners)
           for line, word in _spelt_choices(
               open(path, encoding='utf-8').read(), words)]
  assert not found


@pytest.mark.parametrize('line, word', [
    ("fix = advice if cluster.engine.startswith('Open MPI') else ''", 'Open MPI'),
    ("if engine in ('Slurm', 'XPK'):\n  pass", 'Slurm'),
    ("names = {'tf.data': 1, 'dali': 2}", 'tf.data'),
    ("kinds = {'decoded', 'encoded'}", 'decoded'),
    ("formats = {'jax': 'keras .weights.h5'}", 'jax'),
    ("if plan.backend.name == 'jax':\n  pass", 'jax'),
    ("if pipeline != 'dali':\n  pass", 'dali'),
    ("if value not in ('', 'memory'):\n  pass", 'memory'),
])
def test_the_choice_check_finds_each_kind_of_use(line, word):
  words = {word for _, found, _ in _vocabularies() for word in found}
  assert [w for _, w in _spelt_choices(line, words)][:1] == [word]


# A module run as a process: `python -m NAME`, a launcher or a library one.
# (A message that tells the user to run one names it in a sentence.)
_STARTED = re.compile(r'^(launch|pipeline)(\.\w+)+$|^ -m (launch|pipeline)\.')


def _starts_a_process(text):
  """The lines of `text` that name a module to run as a process, docstrings
  aside: 'launch.train' as a string, or f'{python} -m launch.train'."""
  return sorted({node.lineno for node in _strings(text)
                 if _STARTED.search(node.value)})


def test_the_processes_the_library_starts_are_named_in_one_module():
  """No import shows that a module starts `python -m launch.train`:
  pipeline/launchers.py names every such module, the rest use its names."""
  found = [f'{module}:{line}' for module, path in sorted(MODULES.items())
           if module.startswith('pipeline.') and module != 'pipeline.launchers'
           for line in _starts_a_process(open(path, encoding='utf-8').read())]
  assert not found


def test_the_process_check_finds_each_form():
  assert _starts_a_process(
      "args = [sys.executable, '-m', 'launch.probe']\n"
      "peer = 'pipeline.reports.compare.keras_peer'\n"
      "line = f'{python} -m launch.train {args}'\n"
      "error = 'or start `python -m launch.train` on every worker'\n"
      '"""python -m launch.train in a docstring"""\n'
      "text = 'launch.pod: the trainer exited'\n") == [1, 2, 3]


def _takes_config_and_plan(text):
  return [node.name for node in ast.walk(ast.parse(text))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and {'config', 'plan'} <= {a.arg for a in node.args.args +
                                     node.args.kwonlyargs}]


def test_the_plan_travels_alone():
  """The plan carries its config: what runs takes the plan, or the config
  where nothing is resolved yet, never both."""
  both = [f'{module}: {name}' for module, path in MODULES.items()
          for name in _takes_config_and_plan(
              open(path, encoding='utf-8').read())]
  assert not both


def test_the_plan_check_finds_both():
  assert _takes_config_and_plan(
      'def f(config, plan):\n  pass\n'
      'def g(plan, *, config=None):\n  pass\n'
      'def h(plan, cfg):\n  pass\n') == ['f', 'g']


# Each consumer is given what it reads: a function reading a field or two
# takes those values, a part its parts.Settings. The config is taken whole
# where it is resolved, checked, recorded or forwarded to a process (the
# plan, validation, the run's identity, the launchers, the probe's
# variants, configs/default.py's sections).
MAX_WHOLE_CONFIG_FUNCTIONS = 40


def _take_config(text):
  return [node.name for node in ast.walk(ast.parse(text))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and 'config' in {a.arg for a in node.args.args +
                           node.args.kwonlyargs}]


def _writes_into_a_config(text):
  """The lines of `text` that assign to a config's field (config.x = ...,
  config[k] = ..., config.update(...), setattr(config, ...)): a name or
  attribute called config, or plan.config; not JAX's own jax.config."""
  def is_config(node):
    return ((isinstance(node, ast.Name) and node.id == 'config') or
            (isinstance(node, ast.Attribute) and node.attr == 'config' and
             not (isinstance(node.value, ast.Name) and node.value.id == 'jax')))
  found = []
  for node in ast.walk(ast.parse(text)):
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AugAssign,
                                                  ast.AnnAssign)) else [])
    for target in targets:
      for each in (target.elts if isinstance(target, ast.Tuple)
                   else [target]):
        if (isinstance(each, (ast.Attribute, ast.Subscript)) and
            is_config(each.value)):
          found.append(node.lineno)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ('update', 'unlock') and
        is_config(node.func.value)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == 'setattr' and node.args and
            is_config(node.args[0])):
      found.append(node.lineno)
  return sorted(set(found))


def test_no_module_of_the_pipeline_writes_into_a_config():
  """The plan is the one resolved truth: what a config leaves open is the
  plan's field, and the config stays as given (validation builds one
  whole, from the defaults and the given values)."""
  writes = [f'{module}:{line}' for module, path in sorted(MODULES.items())
            if module.startswith('pipeline')
            for line in _writes_into_a_config(open(path,
                                                   encoding='utf-8').read())]
  assert not writes


def test_the_write_check_finds_each_form():
  assert _writes_into_a_config(
      'config.image_size = 1\n'
      'config["augment"] = 2\n'
      'plan.config.epochs += 1\n'
      'config.image_size, config.eval_image_size = 1, 2\n'
      'config.update(epochs=1)\n'
      'setattr(config, "seed", 1)\n'
      'jax.config.update("x", 1)\n'
      'other.image_size = 3\n') == [1, 2, 3, 4, 5, 6]


def _reads_the_plans_config(text):
  """The lines of `text` that read a plan's config (plan.config,
  self.plan.config, _plan.config)."""
  return sorted({node.lineno for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.Attribute) and node.attr == 'config'
                 and ((isinstance(node.value, ast.Name) and
                       node.value.id.lstrip('_') == 'plan') or
                      (isinstance(node.value, ast.Attribute) and
                       node.value.attr.lstrip('_') == 'plan'))})


def test_nothing_outside_run_reads_the_plans_config():
  """The plan's fields are what runs reads: the config it was resolved
  from is read where it is resolved and recorded (pipeline/run/), and
  each consumer is handed the keys it reads (plan.recipe, plan.outputs)."""
  reads = [f'{module}:{line}' for module, path in sorted(MODULES.items())
           if not module.startswith('pipeline.run')
           for line in _reads_the_plans_config(open(path,
                                                     encoding='utf-8').read())]
  assert not reads


def test_the_plans_config_check_finds_each_form():
  assert _reads_the_plans_config(
      'plan.config.model\n'
      'x = self.plan.config\n'
      'f(_plan.config)\n'
      'plan.recipe.model\n'
      'jax.config.update("x", 1)\n'
      'config.model\n') == [1, 2, 3]


def test_few_functions_take_the_whole_config():
  taking = [f'{module}: {name}' for module, path in sorted(MODULES.items())
            for name in _take_config(open(path, encoding='utf-8').read())]
  assert len(taking) <= MAX_WHOLE_CONFIG_FUNCTIONS, '\n'.join(taking)


def test_the_config_count_finds_each_form():
  assert _take_config('def f(config):\n  pass\n'
                      'def g(a, *, config=None):\n  pass\n'
                      'def h(settings):\n  pass\n') == ['f', 'g']


def test_a_part_reads_only_its_own_keys():
  from pipeline import parts  # pylint: disable=g-import-not-at-top
  from pipeline.data import sources  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.dataset = 'csv'
  settings = sources.SOURCES.settings(config)
  assert set(settings) == {'dataset', 'train_csv', 'eval_csv',
                           'eval_fraction', 'num_classes'}
  assert settings.eval_fraction == config.eval_fraction
  with pytest.raises(AttributeError, match="'image_size' is not a key of "
                     'this part'):
    settings.image_size  # pylint: disable=pointless-statement
  with pytest.raises(KeyError):
    settings['train_files']  # pylint: disable=pointless-statement
  assert isinstance(settings, parts.Settings)


@pytest.mark.parametrize('module', sorted(MODULES))
def test_modules_and_functions_stay_readable(module):
  text = open(MODULES[module], encoding='utf-8').read()
  assert len(text.splitlines()) <= MAX_MODULE_LINES
  long = [f'{node.name}: {node.end_lineno - node.lineno + 1} lines'
          for node in ast.walk(ast.parse(text))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
  assert not long


# What runs inside the JAX trainer's compiled programs: the step and the
# moving average (backends/jax/), the network and the optimizer the step
# applies, and everything of recipe/ they import, found here from the
# imports themselves (a new model family
# is among them as soon as models/ imports it). A TensorFlow op there fails
# only when JAX traces it, mid-run (TracerArrayConversionError); keras.ops
# runs on either backend.
TRACED_ROOTS = ('pipeline.backends.jax.programs', 'pipeline.backends.jax.ema',
                'pipeline.recipe.models', 'pipeline.recipe.optimizers')


def _traced_by_jax():
  graph = {module: _imports(path) for module, path in MODULES.items()}
  traced, frontier = set(TRACED_ROOTS), list(TRACED_ROOTS)
  while frontier:
    for imported in graph[frontier.pop()]:
      if imported.startswith('pipeline.recipe') and imported not in traced:
        traced.add(imported)
        frontier.append(imported)
  return traced


def _uses_tensorflow(path):
  """Lines of `path` that import TensorFlow, in any form."""
  tree = ast.parse(open(path, encoding='utf-8').read())
  return [node.lineno for node in ast.walk(tree)
          if isinstance(node, ast.Import) and any(
              a.name.split('.')[0] == 'tensorflow' for a in node.names)
          or isinstance(node, ast.ImportFrom)
          and (node.module or '').split('.')[0] == 'tensorflow']


def test_nothing_the_jax_programs_trace_calls_tensorflow():
  traced = _traced_by_jax()
  # Every family, layer form, loss, optimizer and schedule is found.
  assert {'pipeline.recipe.models.efficientnet', 'pipeline.recipe.models.resnet',
          'pipeline.recipe.layers', 'pipeline.recipe.objective',
          'pipeline.recipe.optimizers', 'pipeline.recipe.schedules',
          'pipeline.recipe.moving_average'} <= traced
  found = {m: _uses_tensorflow(MODULES[m]) for m in traced}
  assert not {m: lines for m, lines in found.items() if lines}


def test_the_tensorflow_check_finds_an_import(tmp_path):
  bad = tmp_path / 'schedule.py'
  bad.write_text('import keras\n\ndef f(step):\n  import tensorflow as tf\n'
                 '  return tf.floor(step)\n')
  assert _uses_tensorflow(str(bad)) == [4]
  bad.write_text('from tensorflow import math\n')
  assert _uses_tensorflow(str(bad)) == [1]


def test_a_private_module_is_imported_only_with_the_reason():
  """Keras' and JAX's private modules change without notice: each import
  of one says, just above it, why no public API serves."""
  private = re.compile(r'^\s*((from|import) (keras\.src|jax\._src|jaxlib\._)'
                       r'|from (keras|jax|jaxlib)[\w.]* import _)')
  unexplained = []
  for module, path in MODULES.items():
    lines = open(path, encoding='utf-8').read().splitlines()
    for number, line in enumerate(lines):
      if private.match(line) and not any(
          'Private, as no public API' in above
          for above in lines[max(number - 4, 0):number]):
        unexplained.append(f'{module}:{number + 1}: {line.strip()}')
  assert not unexplained


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
       'import sys\nfrom pipeline import backends\n'
       'from pipeline.rules.speed import compile_cache\n'
       'for name in backends.BACKENDS[1:]:\n'
       '  backends.load(name).software()\n'
       "print(sorted({m.split('.')[0] for m in sys.modules} & "
       "{'tensorflow', 'jax', 'keras'}))"],
      cwd=REPO, capture_output=True, text=True, check=True).stdout
  assert loaded.strip() == '[]'


def test_the_tree_shows_the_roles():
  import pipeline  # pylint: disable=g-import-not-at-top
  folders = collections.Counter(
      m.split('.')[1] for m in MODULES if m.startswith('pipeline.')
      and m.count('.') >= 2)
  # errors.py, launchers.py and parts.py are floors of one module each.
  assert set(folders) | {'errors', 'launchers', 'parts'} == set(
      pipeline.FLOORS)
  flat = [m for m in MODULES if m.startswith('pipeline.') and m.count('.') == 1
          and m.split('.')[1] not in pipeline.FLOORS]
  assert not flat


def _room(module):
  """The floor a module stands on: its folder under pipeline/ (errors.py
  is one), or 'configs' or 'launch'."""
  parts = module.split('.')
  return parts[0] if parts[0] in ('configs', 'launch') else parts[1]


def _climbs(graph, floors):
  """Imports that run up `floors` (bottom first), configs/ below them and
  launch/ on top."""
  order = {room: level for level, room in enumerate(
      ('configs', *floors, 'launch'))}
  return sorted(f'{module} imports {imported}'
                for module, imports in graph.items() for imported in imports
                if module != 'pipeline' and imported != 'pipeline'
                and order[_room(imported)] > order[_room(module)])


def test_every_import_points_down_the_floors():
  """pipeline/__init__.py states the floors; no import climbs them."""
  import pipeline  # pylint: disable=g-import-not-at-top
  graph = {module: _imports(path) for module, path in MODULES.items()}
  assert not _climbs(graph, pipeline.FLOORS)


def test_the_floor_check_finds_a_climb():
  import pipeline  # pylint: disable=g-import-not-at-top
  graph = {'pipeline.rules.speed.precision': {'pipeline.recipe.optimizers'},
           'pipeline.recipe.optimizers': {'pipeline.rules.speed.precision'},
           'configs.default': {'pipeline.recipe.schedules'},
           'pipeline.rules.config.validation': {'configs.default'}}
  assert _climbs(graph, pipeline.FLOORS) == [
      'configs.default imports pipeline.recipe.schedules',
      'pipeline.rules.speed.precision imports pipeline.recipe.optimizers']


def test_configs_and_validation_load_no_framework():
  """configs/ stands below every floor (plain values), so validation,
  which completes every config from configs/default.py, loads no
  TensorFlow, JAX or Keras."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  loaded = subprocess.run(
      [sys.executable, '-c',
       'import sys\nfrom pipeline.rules.config import validation\n'
       'from configs import imagenet, cifar100_finetune\n'
       'validation.complete({})\n'
       "print(sorted({m.split('.')[0] for m in sys.modules} & "
       "{'tensorflow', 'jax', 'keras'}))"],
      cwd=REPO, capture_output=True, text=True, check=True).stdout
  assert loaded.strip() == '[]'


def test_every_named_parts_key_has_its_default_in_the_default_config():
  """Each part's own keys (sources', schedules', ...) are fields of
  configs/default.py, their one home: a part's key missing there would be
  refused as unknown."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline import recipe  # pylint: disable=g-import-not-at-top
  from pipeline.data import augmentations, sources  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  tables = (sources.SOURCES, augmentations.AUGMENTATIONS, *recipe.tables())
  assert len(tables) == 8
  keys = {key for table in tables for key in table.keys()}
  assert len(keys) >= 16  # The keys were read.
  assert sorted(keys - set(config)) == []
  for table in tables:  # And each table's choice of part, or none yet.
    if table.left_open and config[table.key] == table.left_open[0]:
      continue  # Left to the run (augment: the source's own).
    assert table[config[table.key]]


def _check_members(protocol, implementations):
  """Every member `protocol` declares (methods, properties, attributes) is
  on each of `implementations` ({name: class or object}), methods with
  the same parameters; returns how many members were declared."""
  import inspect  # pylint: disable=g-import-not-at-top
  declared = {name: member for name, member in vars(protocol).items()
              if not name.startswith('_')}
  declared.update(dict.fromkeys(protocol.__annotations__))
  for name, implementation in implementations.items():
    fields = getattr(implementation, '__dataclass_fields__', {})
    for member, function in declared.items():
      assert hasattr(implementation, member) or member in fields, (
          name, member)
      if inspect.isfunction(function):
        theirs = inspect.signature(getattr(implementation, member))
        ours = list(inspect.signature(function).parameters)
        assert list(theirs.parameters) in (ours, ours[1:]), (name, member)
  return len(declared)


def test_both_trainers_implement_the_whole_interface():
  """The loop, the evaluator, the benchmark and the export call a trainer
  through interface.Trainer only."""
  import importlib  # pylint: disable=g-import-not-at-top
  from pipeline.backends import interface  # pylint: disable=g-import-not-at-top
  trainers = {}
  for name in ('tensorflow', 'jax'):
    try:
      trainers[name] = importlib.import_module(
          f'pipeline.backends.{name}.trainer').Trainer
    except ImportError:  # JAX is not installed in this environment.
      pytest.importorskip(name)
      raise
  assert _check_members(interface.Trainer, trainers) >= 14


def test_both_backends_implement_the_whole_interface():
  """backends/interface.py is what the rest of the library calls: every
  member it declares exists on both backends, with the same parameters."""
  from pipeline import backends  # pylint: disable=g-import-not-at-top
  from pipeline.backends import interface  # pylint: disable=g-import-not-at-top
  assert _check_members(interface.Backend, {
      name: backends.load(name) for name in backends.BACKENDS[1:]}) >= 12


class _Partial:
  """A trainer without step_cost, with train taking other parameters."""
  model = ema = num_classes = step = skipped_steps = loss_scale = None

  def train(self, batches, num_steps):
    del batches, num_steps


def test_the_interface_check_finds_a_missing_member_and_other_parameters():
  from pipeline.backends import interface  # pylint: disable=g-import-not-at-top
  with pytest.raises(AssertionError, match="'learning_rate'"):
    _check_members(interface.Trainer, {'partial': _Partial})
  _Partial.learning_rate = lambda self: 0.0
  with pytest.raises(AssertionError, match="'train'"):
    _check_members(interface.Trainer, {'partial': _Partial})


def test_the_notes_stay_short_and_the_readme_maps_the_code():
  """BUILD_NOTES.md is a current record, not a history; README opens with
  its contents, a map of the code (every floor of pipeline/) and the
  flags, before the long sections."""
  import pipeline  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'BUILD_NOTES.md'), encoding='utf-8') as f:
    assert len(f.read().splitlines()) <= 400
  with open(os.path.join(REPO, 'README.md'), encoding='utf-8') as f:
    readme = f.read()
  headings = [line[3:] for line in readme.splitlines()
              if line.startswith('## ')]
  assert headings[:3] == ['Contents', 'The code, in one screen',
                          'Flags and configs']
  contents = readme.split('## Contents')[1].split('\n## ')[0]
  assert [h for h in headings[1:] if f'[{h}](#' not in contents] == []
  code_map = readme.split('## The code, in one screen')[1].split('\n## ')[0]
  assert [floor for floor in pipeline.FLOORS
          if not re.search(rf'\b{floor}(/|\.py)', code_map)] == []


def _unnamed_modules(package_folder):
  """The modules of a package its __init__'s docstring does not name."""
  doc = ast.get_docstring(ast.parse(open(
      os.path.join(package_folder, '__init__.py'), encoding='utf-8').read()))
  return sorted(name for name in os.listdir(package_folder)
                if name.endswith('.py') and name != '__init__.py' and
                name[:-3] not in (doc or ''))


def test_each_package_says_what_its_modules_hold():
  """The tree shows the design: a package's docstring names every module
  in it, so a new file is placed where a reader looks for it."""
  unnamed = [f'{os.path.relpath(folder, REPO)}: {", ".join(names)}'
             for folder, _, files in os.walk(PIPELINE)
             if '__init__.py' in files
             for names in [_unnamed_modules(folder)] if names]
  assert not unnamed


def test_the_docstring_check_finds_an_unnamed_module(tmp_path):
  (tmp_path / '__init__.py').write_text('"""holds named.py."""\n')
  for name in ('named.py', 'forgotten.py'):
    (tmp_path / name).write_text('')
  assert _unnamed_modules(str(tmp_path)) == ['forgotten.py']
