"""Which pipeline makes a run's batches: tf.data, or NVIDIA DALI (dali/).

--config.input_pipeline names one, or `auto`, which takes DALI on GPUs
where it is installed and was measured faster on this GPU model and core
count (launch.benchmark --input_only --save_policy keeps both rates), and
tf.data otherwise.
"""

import enum

from absl import logging

from pipeline.data import dali
from pipeline.data.dali import index as dali_index
from pipeline.errors import UserError
from pipeline.storage import user_cache


class Pipeline(enum.Enum):
  """What makes a run's batches; the value is the config's name."""
  TF_DATA = 'tf.data'
  DALI = 'dali'

  def __str__(self):
    return self.value


AUTO = 'auto'  # The config's setting that picks either on evidence.


def choose(requested, spec, source, device_kind, saved_rates=None):
  """(input pipeline, reason) for `requested`, the config's
  input_pipeline (auto|tf.data|dali), to run `spec` (an InputSpec).

  auto takes DALI on GPUs where it is installed and was measured faster on
  this GPU model (`saved_rates`: launch.benchmark --input_only
  --save_policy's images/s per pipeline), tf.data otherwise. An explicit
  dali is checked here against the loaded `source`: one line for what it
  cannot run.
  """
  requested = setting(requested)
  if requested is Pipeline.TF_DATA:
    return Pipeline.TF_DATA, 'as configured'
  if requested is Pipeline.DALI:
    dali.check(spec, source)
    return Pipeline.DALI, ('as configured; decoding on the GPU'
                           if device_kind == 'GPU' else
                           'as configured; decoding on the CPU (no GPU)')
  if device_kind != 'GPU':
    return Pipeline.TF_DATA, ('auto: DALI pays on GPUs only (its CPU '
                              'decoding is slower)')
  if not dali.installed():
    return Pipeline.TF_DATA, 'auto: DALI is not installed'
  if not saved_rates:
    return Pipeline.TF_DATA, ('auto: DALI not measured on this GPU; '
                              'launch.benchmark --input_only --save_policy '
                              'measures both')
  rates = ', '.join(f'{name} {rate:,.0f}' for name, rate in
                    sorted(saved_rates.items()))
  faster = Pipeline(max(saved_rates, key=saved_rates.get))
  refusal = dali.refusal(spec, source)
  if faster is Pipeline.DALI and not refusal:
    return Pipeline.DALI, f'auto: measured faster on this GPU ({rates} img/s)'
  return Pipeline.TF_DATA, (f'auto: measured on this GPU ({rates} img/s)'
                            + (f'; DALI cannot run this config: {refusal}'
                               if faster is Pipeline.DALI else ''))


def setting(text):
  """The config's input_pipeline as a Pipeline, or AUTO; one line for any
  other name."""
  if text == AUTO:
    return AUTO
  try:
    return Pipeline(text)
  except ValueError:
    raise UserError(f'--config.input_pipeline={text!r}: expected {AUTO}, '
                    + ' or '.join(p.value for p in Pipeline)) from None


def may_decode_here(text):
  """Whether the config's input_pipeline may put DALI's decoders in this
  process (an explicit dali, or auto where DALI is installed)."""
  chosen = setting(text)
  return chosen is Pipeline.DALI or (chosen == AUTO and dali.installed())


def _saved_path(gpu_name):
  # Input speed is the GPU's decoder and this host's cores together.
  return user_cache.folder('input', user_cache.slug(gpu_name),
                           f'{dali_index.cpu_threads()}-cores.json')


def save_rates(gpu_name, rates):
  """Keeps launch.benchmark --input_only's images/s per pipeline for this
  GPU model and core count; returns the file."""
  path = _saved_path(gpu_name)
  user_cache.write_json(path, {'gpu': gpu_name, 'images_per_sec': rates})
  return path


def saved_rates(gpu_name):
  """{pipeline: images/s} saved for this GPU model and core count, or
  None. An unreadable file is passed over with one warning line."""
  path = _saved_path(gpu_name)
  try:
    record = user_cache.read_json(path)
    return record and {str(name): float(rate) for name, rate in
                       record['images_per_sec'].items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    logging.warning('saved input measurement %s is unreadable (%s); using '
                    'tf.data', path, e)
    return None
