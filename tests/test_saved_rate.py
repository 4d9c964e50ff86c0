"""A run held to the step rate launch.probe saved for its card
(pipeline/rules/speed/saved_rate.py): the plan says so, and a step more
than 10% below it gets one warning. A real tiny run on TensorFlow here;
the JAX route reads the same record (tests/test_probe.py checks the
probe's key is a run's)."""

import ml_collections

from conftest import run_train
from conftest import tiny_args
from pipeline.rules.speed import saved_rate


def _tiny_step(devices=1, policy='float32'):
  config = ml_collections.ConfigDict(dict(
      model='efficientnet_tiny', image_size=32, global_batch_size=32,
      batch_norm='one_pass', squeeze_excite='matmul', depthwise='conv'))
  return saved_rate.step_key(config, config.image_size, devices, policy)


def _software():
  from pipeline.backends.tensorflow import TensorFlowBackend  # pylint: disable=g-import-not-at-top
  return TensorFlowBackend().software()


def _save(cache, rate, monkeypatch):
  """A rate saved for the tiny run's step in the cache folder `cache`."""
  with monkeypatch.context() as patched:
    patched.setenv('XDG_CACHE_HOME', str(cache))
    saved_rate.save('CPU', _software(), _tiny_step(), rate,
                    'launch.probe (stage a, a test)')


def test_a_step_far_below_the_saved_rate_is_said_once(tmp_path, tfds_dir,
                                                      monkeypatch):
  _save(tmp_path / 'cache', 1e9, monkeypatch)
  result = run_train(*tiny_args(str(tmp_path / 'run'), tfds_dir,
                                '--policy=float32'),
                     env={'XDG_CACHE_HOME': str(tmp_path / 'cache')})
  assert result.returncode == 0, result.stderr[-3000:]
  assert ('the step is held to 1,000,000,000 img/s, measured by '
          'launch.probe (stage a, a test) on this card and software') in (
              result.stderr)
  slow = [line for line in result.stderr.splitlines() if 'Slow step: ' in line]
  assert len(slow) == 1, result.stderr[-3000:]
  assert 'of the 1,000,000,000 img/s measured by launch.probe' in slow[0]
  assert '--repeats=3 --save_autotune' in slow[0]


def test_a_step_within_a_tenth_of_the_rate_says_nothing():
  """Only a step more than 10% below the saved rate is a line; the rate
  the progress line passes is the step's own, input waits left out."""
  saved = (1000.0, 'launch.probe (a test)')
  assert saved_rate.slow_step_line(950.0, saved, '') is None
  line = saved_rate.slow_step_line(800.0, saved, '/cache/xla')
  assert line.startswith('Slow step: 800 img/s (input waits left out), 0.80 '
                         'of the 1,000 img/s measured by launch.probe')
  # The fix that works: keep a fast process's picks, which every later
  # run loads; clearing the cache is only another draw.
  assert '`python -m launch.probe --repeats=3 --save_autotune`' in line
  assert 'every later run on this card loads them' in line
  assert 'clear' not in line
