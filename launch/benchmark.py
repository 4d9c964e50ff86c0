"""Benchmark input, model ceiling and real training for a config.

  python -m launch.benchmark --config.image_size=224 --num_executions=5
  # ImageNet's input, uncached, on photographs, beside the reference:
  python -m launch.make_tfrecords --dataset=photos --output_dir=/tmp/photos
  python -m launch.benchmark --config=configs/imagenet.py --input_only \
      --config.dataset=tfrecord --config.train_files='/tmp/photos/train-*' \
      --config.eval_files='/tmp/photos/eval-*' --config.num_classes=10 \
      --config.global_batch_size=32 --target_images_per_sec=3454

  # First run on new hardware: which policy and XLA setting is fastest here.
  python -m launch.benchmark --policies=float32,mixed_float16,mixed_bfloat16

  # XLA under MirroredStrategy, on one GPU split in two; --xla=auto on
  # several GPUs of this model then follows it.
  python -m launch.benchmark --policies=mixed_bfloat16 --split_gpus=2 \
      --save_policy

  # Where a step's time goes in each policy, by kind of layer:
  python -m launch.benchmark --policies=float32,mixed_bfloat16 \
      --xla_settings=off --layer_times --config.image_size=128

  # The same model on each Keras backend, side by side (JAX environment).
  python -m launch.benchmark --backends=tensorflow,jax --num_executions=3

Prints a table and writes it as JSON (--output, default under runs/). Same hardware and config
flags as launch.train.
"""

import os
import sys
import time

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from launch import cli
from pipeline import backends
from pipeline.reports import benchmark
from pipeline.reports.benchmark import layer_times
from pipeline.reports.benchmark import tables as benchmark_tables
from pipeline.data import dali
from pipeline.data import input_pipeline as input_pipeline_lib
from pipeline.run import plan
from pipeline.reports import saved_measurements
from pipeline.storage import workdirs
from pipeline.errors import UserError


_EXECUTIONS = flags.DEFINE_integer(
    'num_executions', 5, 'Timed calls of steps_per_execution steps each.')
_OUTPUT = flags.DEFINE_string(
    'output', None, 'Where the JSON goes; default: '
    'runs/benchmark-YYYYMMDD-HHMMSS.json.')
_INPUT_ONLY = flags.DEFINE_bool(
    'input_only', False, 'Measure the input pipeline alone (no model).')
_POLICIES = cli.define_policy_list(
    'policies', [], 'Sweep instead: train a few executions on a synthetic '
    'batch for each of these policies (and each XLA setting valid here) and '
    'print images/s, compile time and the fastest, e.g. '
    'float32,mixed_float16,mixed_bfloat16.', required=False)
_SAVE_POLICY = flags.DEFINE_bool(
    'save_policy', False, 'With --policies on a GPU: keep the fastest policy '
    'for this GPU model and software, on a CPU for its model, the software, '
    'the network and its size, so --policy=auto takes it there '
    '(pipeline/rules/speed/saved_policy.py). With '
    '--backends=tensorflow,jax: keep the faster backend and its policy, so '
    '--backend=auto takes them (pipeline/rules/speed/measured.py). With --input_only on TFRecord files: '
    'keep tf.data\'s and DALI\'s images/s, so --config.input_pipeline=auto '
    'takes the faster (pipeline/data/dali.py).')
_LAYER_TIMES = flags.DEFINE_bool(
    'layer_times', False, "With --policies: also profile each pair's step "
    'and print its time by kind of layer (depthwise and 1x1 convolutions, '
    'batch norm, squeeze-excite, casts, ...), a column a policy.')
_XLA_SETTINGS = flags.DEFINE_list(
    'xla_settings', ['off', 'on'], 'With --policies: the XLA settings to try '
    '(off, on).')
flags.register_validator(
    'xla_settings', lambda settings: set(settings) <= {'off', 'on'},
    '--xla_settings takes off, on or both')
_BACKENDS = flags.DEFINE_list(
    'backends', [], 'Compare instead: the same benchmark on each of these '
    "Keras backends (tensorflow, jax), each in its own process (Keras' "
    'backend is fixed per process), printed side by side.')
_NAMED_BACKENDS = [name for name in backends.BACKENDS if name != 'auto']
flags.register_validator(
    'backends', lambda names: set(names) <= set(_NAMED_BACKENDS),
    f'--backends takes {", ".join(_NAMED_BACKENDS)} or both')
_TARGET = flags.DEFINE_float(
    'target_images_per_sec', 0,
    'What the accelerators consume (e.g. 3454: EfficientNet-B0 with AMP on '
    'one A100): says whether this input feeds it, and how many cores would.')


# --helpshort lists the flags every launcher takes from launch/cli.py
# too (after the policy lists cli.py defines for this launcher).
flags.adopt_module_key_flags(cli)

def main(config):
  request = cli.request(config, workdir_default=False)
  failed = ()
  output = _OUTPUT.value or os.path.join(
      'runs', time.strftime('benchmark-%Y%m%d-%H%M%S.json'))
  if _BACKENDS.value:
    gpu = saved_measurements.gpu_to_save_for(_SAVE_POLICY.value,
                                             _BACKENDS.value)
    result = benchmark.across_backends(_BACKENDS.value, _child_args())
    text = benchmark_tables.backends_table(result)
    failed = benchmark.failed_backends(result)
    if gpu and not failed:
      text += '\n' + saved_measurements.save_backends(result, gpu)
  elif _POLICIES.value:
    result, text = _sweep(config, request)
  else:
    result, text = _one_run(plan.resolve(config, request))
  print(text)
  os.makedirs(os.path.dirname(output) or '.', exist_ok=True)
  workdirs.write_json(output, result)
  print(f'written to {output}')
  if failed:
    raise UserError(f'the benchmark failed on --backend={",".join(failed)} '
                    '(its row above says why)'
                    + ('; no backend was saved' if _SAVE_POLICY.value else ''))


def _sweep(config, request):
  """--policies: each policy and XLA setting on a synthetic batch."""
  hardware = plan.find_hardware(request)
  if _SAVE_POLICY.value and hardware.device_kind not in ('GPU', 'CPU'):
    raise UserError('--save_policy keeps a policy for a GPU model or a CPU; '
                    f'this machine trains on {hardware.device_kind}')
  result = benchmark.sweep(config, request, _POLICIES.value,
                           _XLA_SETTINGS.value, _EXECUTIONS.value, hardware,
                           profile_layers=_LAYER_TIMES.value)
  text = benchmark_tables.sweep_table(result)
  if _LAYER_TIMES.value:
    text += '\n' + layer_times.table(result['rows'])
  if _SAVE_POLICY.value:
    text += '\n' + saved_measurements.save_sweep(result)
  return result, text


def _one_run(resolved):
  """The input, the model's ceiling and real training of the `resolved`
  plan."""
  gpu = resolved.hardware.gpu_name
  if _SAVE_POLICY.value and not (_INPUT_ONLY.value and gpu):
    raise UserError('--save_policy keeps what was measured fastest on a '
                    'GPU model: with --policies, --backends, or '
                    '--input_only (the input pipelines) on a GPU')
  result = benchmark.run(resolved, _EXECUTIONS.value, _INPUT_ONLY.value,
                         _TARGET.value)
  text = benchmark_tables.table(result)
  if _SAVE_POLICY.value:
    rates = result.get('pipelines_images_per_sec', {})
    if str(input_pipeline_lib.Pipeline.DALI) not in rates:
      raise UserError('--save_policy --input_only compares tf.data with '
                      'DALI on TFRecord files (--config.dataset=tfrecord) '
                      f'where DALI is installed; {dali.INSTALL}')
    text += (f'\nkept for --config.input_pipeline=auto on {gpu}: '
             f'{input_pipeline_lib.save_rates(gpu, rates)}')
  return result, text


def _child_args():
  """This command's flags for a child benchmark, less --backends,
  --save_policy and --output (the child gets its own --backend and
  --output)."""
  return [a for a in sys.argv[1:]
          if not a.startswith(('--backends', '--output', '--backend=',
                               '--save_policy', '--nosave_policy'))]


if __name__ == '__main__':
  cli.run(main)
