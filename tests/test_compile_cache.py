"""XLA's persistent compile cache: chosen, set up, and never fatal.

The GPU rules are in test_precision.py's table (stand-in GPUs). Here the
cache runs for real on this CPU, where a folder given in the config turns
it on: TensorFlow writes and loads its compiled programs, and an entry
damaged on disk is set aside instead of failing the run.
"""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from conftest import run_train
from conftest import tiny_args
from pipeline.backends.tensorflow import compile_cache as tf_compile_cache
from pipeline import backends
from pipeline.errors import UserError
from pipeline.rules.speed import compile_cache
from pipeline.run import environment

# A process that prepares as a launcher does (the project's own code), then
# runs one XLA-compiled function.
_COMPILE_ONCE = """
import sys
from pipeline.run import environment
environment.prepare(['launch/x.py', '--config.compile_cache_dir=' + sys.argv[1]])
import tensorflow as tf
f = tf.function(jit_compile=True)(lambda x: tf.nn.relu(x * 2 + 1) @ x)
print('result', float(tf.reduce_sum(f(tf.ones((4, 4))))))
"""


def _compile_once(folder):
  return subprocess.run([sys.executable, '-c', _COMPILE_ONCE, str(folder)],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        check=False)


def _entries(folder):
  return sorted(p for p in os.listdir(folder) if p.endswith('.pb'))


def test_a_damaged_entry_is_set_aside_and_compiled_again(tmp_path):
  folder = tmp_path / 'xla'
  first = _compile_once(folder)
  assert first.returncode == 0, first.stderr[-2000:]
  assert 'result 192.0' in first.stdout
  [entry] = _entries(folder)
  data = (folder / entry).read_bytes()
  assert tf_compile_cache._readable_program(str(folder / entry))
  (folder / entry).write_bytes(data[:len(data) // 2])  # A torn copy.
  assert not tf_compile_cache._readable_program(str(folder / entry))

  second = _compile_once(folder)

  # Without the check TensorFlow fails here ("Read less bytes than
  # requested"); with it, one line and a fresh compile.
  assert second.returncode == 0, second.stderr[-2000:]
  assert 'result 192.0' in second.stdout
  assert (f'compile cache: 1 damaged entry set aside in {folder}/damaged; '
          'compiling it again') in second.stderr
  assert os.listdir(folder / 'damaged') == [entry]
  assert _entries(folder) == [entry]
  # Compiled and saved again, whole.
  assert tf_compile_cache._readable_program(str(folder / entry))


def test_a_whole_entry_is_loaded_not_compiled_again(tmp_path):
  folder = tmp_path / 'xla'
  assert _compile_once(folder).returncode == 0
  [entry] = _entries(folder)
  written = os.stat(folder / entry).st_mtime_ns
  again = _compile_once(folder)
  assert again.returncode == 0, again.stderr[-2000:]
  assert os.stat(folder / entry).st_mtime_ns == written  # Read, not rewritten.
  assert 'damaged' not in again.stderr


def test_autotune_entries_are_checked_as_protobuf_text(tmp_path):
  autotune = tmp_path / 'autotune'
  autotune.mkdir()
  whole = ('version: 3\nresults {\n  device: "CUDA: 9.0"\n  hlo: "fusion"\n'
           '  result { run_time { nanos: 31744 } gemm { algorithm: 5 } }\n}\n')
  (autotune / 'a.textproto').write_text(whole)
  (autotune / 'b.textproto').write_text(whole[:len(whole) // 2])
  (autotune / 'c.textproto').write_text('')
  moved = tf_compile_cache.set_aside_damaged(str(tmp_path))
  assert sorted(os.path.basename(p) for p in moved) == ['b.textproto',
                                                       'c.textproto']
  assert os.listdir(autotune) == ['a.textproto']


def test_a_folder_that_cannot_be_written_turns_the_cache_off(tmp_path,
                                                            monkeypatch):
  monkeypatch.setattr(compile_cache, '_chosen', [])  # This process's own.
  blocker = tmp_path / 'file'
  blocker.write_text('not a folder')
  environ = {}
  settings = environment.prepare_compile_cache(
      str(blocker / 'xla'), environ=environ, gpus=[], software='tf-test')
  assert settings.directory is None
  assert settings.describe().startswith(
      f'no compile cache (compile cache off: cannot write {blocker}/xla')
  assert not environ  # TensorFlow would fail the compile on a failed write.


_SMALL = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
          'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}


@pytest.mark.parametrize('setting, backend, gpus, accelerator, environ, '
                         'directory, variables', [
    ('', 'tensorflow', [], False, {}, None, {}),  # A CPU: off unless asked.
    ('/c', 'tensorflow', [], False, {'TF_XLA_FLAGS': '--tf_xla_auto_jit=2'},
     '/c', {'TF_XLA_FLAGS':
            '--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory=/c'}),
    ('off', 'tensorflow', ['NVIDIA H100 80GB HBM3'], True, {}, None, {}),
    # A TPU on JAX: small programs (a model's set-up) cached too.
    ('', 'jax', [], True, {}, '{root}/jax-0.10.2',
     {'JAX_COMPILATION_CACHE_DIR': '{root}/jax-0.10.2', **_SMALL}),
    ('', 'jax', [], False, {}, None, {}),
    ('', 'jax', [], True, {'JAX_COMPILATION_CACHE_DIR': '/mine'}, '/mine',
     _SMALL),
    # The user's own threshold stands.
    ('/c', 'jax', [], False,
     {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '2'}, '/c',
     {'JAX_COMPILATION_CACHE_DIR': '/c',
      'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}),
])
def test_where_the_cache_goes(setting, backend, gpus, accelerator, environ,
                              directory, variables):
  versions = 'jax-0.10.2' if backend == 'jax' else 'tf-2.21.0'
  settings = compile_cache.choose(setting, backends.load(backend), environ, gpus,
                                  accelerator, versions)
  root = compile_cache.root()
  assert settings.directory == (directory and directory.format(root=root))
  assert settings.environment == {k: v.format(root=root)
                                  for k, v in variables.items()}


def test_a_cache_in_the_cloud_is_refused():
  with pytest.raises(UserError, match='compile_cache_dir=gs://b/x: a local '
                     'folder, or off'):
    compile_cache.choose('gs://b/x', backends.load('tensorflow'), {}, [], False, 'tf')


def test_the_setting_comes_from_the_command_line(tfds_dir, tmp_path):
  config = tmp_path / 'config.py'
  config.write_text(
      'from configs import default\n\n\ndef get_config():\n'
      '  config = default.get_config()\n'
      f"  config.compile_cache_dir = '{tmp_path}/xla'\n  return config\n")
  result = run_train(f'--config={config}',
                     *tiny_args(tmp_path / 'run', tfds_dir), '--dry_run')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: compile_cache_dir='{tmp_path}/xla' came from a config file; "
      'XLA reads it as TensorFlow loads, before configs are: give it on the '
      f'command line, --config.compile_cache_dir={tmp_path}/xla')


def test_the_plan_says_where_compiled_programs_go(tfds_dir, tmp_path):
  result = run_train(*tiny_args(tmp_path / 'run', tfds_dir), '--xla=on',
                     f'--config.compile_cache_dir={tmp_path}/xla', '--dry_run')
  assert result.returncode == 0, result.stderr[-2000:]
  assert (f'XLA: on (asked for with --xla=on); compiled programs cached in '
          f'{tmp_path}/xla (compile_cache_dir; the first run on a machine '
          'compiles, for minutes on a GPU or TPU, later runs load)'
          ) in result.stderr
